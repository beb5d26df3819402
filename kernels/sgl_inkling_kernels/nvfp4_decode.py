"""In-register NVFP4 decoding for the W4A16 kernels (Triton helpers).

Two ways to expand a tile of packed e2m1 codes and its fp8 block scales:

- `dequant_portable`: integer bit arithmetic and fp32, exact, valid in the Triton interpreter (which
  has no fp8 type and multiplies bf16 as integers) and on the GPU for any activation dtype;
- `dequant_bf16_asm`: PTX for bf16 activations on the GPU, two bf16 weights per 32-bit register.
  A code's magnitude bits go straight into a bf16's low exponent bits and top mantissa bit, which
  gives e2m1 * 2^-126 (a bf16 subnormal for |v| < 1, kept exact by the bf16 FMA); one packed FMA
  by the block scale pre-multiplied by 2^119 yields e2m1 * scale * 2^-7, exact in bf16 (at most 6
  significant bits, normal range for every fp8 scale), and the kernel multiplies its fp32
  accumulator by scale2 * 2^7.

Both return (lo, hi): the weights of the low and high nibble of every byte (elements 2j and 2j+1).
`nvfp4_wtile` loads one K step of a weight (codes and block scales) and decodes it for a dot.
"""

from __future__ import annotations

from sgl_inkling_kernels._triton import tl, triton


@triton.jit
def fp8_e4m3_to_f32(b):
    """fp8 e4m3fn bit patterns (uint8) -> fp32 values, by integer arithmetic (exact)."""
    b = b.to(tl.int32)
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9
    return tl.where((b & 128) != 0, -v, v)


@triton.jit
def e2m1_to_f32(c):
    """e2m1 codes (int32, 0..15, bit 3 = sign) -> fp32 values {0, .5, 1, 1.5, 2, 3, 4, 6} with sign."""
    mag = c & 7
    v = ((mag << 22) + (126 << 23)).to(tl.float32, bitcast=True)  # 2^(e-1) (1 + m/2): right for mag >= 2
    v = tl.where(mag < 2, mag.to(tl.float32) * 0.5, v)  # 0 and 0.5
    return tl.where((c & 8) != 0, -v, v)


@triton.jit
def dequant_portable(codes, scale, DT: tl.constexpr):
    """codes uint8 [R, G, 8], scale fp32 [R, G, 1] -> (lo, hi) [R, G, 8] in DT: e2m1 * scale."""
    c = codes.to(tl.int32)
    lo = (e2m1_to_f32(c & 15) * scale).to(DT)
    hi = (e2m1_to_f32(c >> 4) * scale).to(DT)
    return lo, hi


@triton.jit
def dequant_bf16_asm(codes, scale):
    """codes uint8 [R, G, 8], scale fp32 [R, G, 1] -> (lo, hi) bf16: e2m1 * scale * 2^-7 (see module doc)."""
    s = (scale * 6.646139978924579e35).to(tl.bfloat16)  # 2^119: exact (a power of two, no overflow)
    s = tl.broadcast_to(s, codes.shape)
    # Per 4 code bytes b0..b3 ($4) and their scales ($5 = s0:s1, $6 = s2:s3): $0 = lo(b0):lo(b1),
    # $1 = lo(b2):lo(b3), $2 = hi(b0):hi(b1), $3 = hi(b2):hi(b3). prmt spreads two bytes into the two
    # 16-bit lanes; a nibble shifted to lane bits 12-15 has its sign at 15 and, shifted down 6 more,
    # its magnitude at 6-8; the two shifted copies do not overlap under the mask, so one or + and.
    # For the high nibbles (masked first) the two shifts are one multiply by 2^8 + 2^2 (no carries).
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 p, q, t, u, z;
        mov.b32 z, 0x80008000;
        prmt.b32 p, $4, 0, 0x4140;
        prmt.b32 q, $4, 0, 0x4342;
        shl.b32 t, p, 12;
        shl.b32 u, p, 6;
        or.b32 t, t, u;
        and.b32 t, t, 0x81C081C0;
        fma.rn.bf16x2 $0, t, $5, z;
        shl.b32 t, q, 12;
        shl.b32 u, q, 6;
        or.b32 t, t, u;
        and.b32 t, t, 0x81C081C0;
        fma.rn.bf16x2 $1, t, $6, z;
        and.b32 p, p, 0x00F000F0;
        mul.lo.u32 t, p, 260;
        and.b32 t, t, 0x81C081C0;
        fma.rn.bf16x2 $2, t, $5, z;
        and.b32 q, q, 0x00F000F0;
        mul.lo.u32 t, q, 260;
        and.b32 t, t, 0x81C081C0;
        fma.rn.bf16x2 $3, t, $6, z;
        }
        """,
        constraints="=r,=r,=r,=r,r,r,r",
        args=[codes, s],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def nvfp4_wtile(Codes, Scales, rows, row_ok, s_cr, s_sr, kb0, KB_TOT, KB: tl.constexpr, MASK_K: tl.constexpr,
                ASM: tl.constexpr, HW_FP8: tl.constexpr, DT: tl.constexpr):  # fmt: skip
    """One K step of an NVFP4 weight, transposed for the dot: (lo, hi) [KB, len(rows)], the weights of
    elements 2 * kb and 2 * kb + 1 for code bytes kb0 .. kb0 + KB of `rows`.

    Only the last, partial K step masks along K (MASK_K): a mask that varies along K stops the loads
    being vectorised, and the software pipeline only takes loads of 4 bytes or more."""
    G: tl.constexpr = KB // 8
    g = tl.arange(0, G)
    grp = kb0 // 8 + g
    if MASK_K:  # per 8-byte block (KB_TOT is a multiple of 8)
        s_ok = row_ok[:, None] & (grp < KB_TOT // 8)[None, :]
    else:
        s_ok = row_ok[:, None] & (g < G)[None, :]
    byte = kb0 + g[:, None] * 8 + tl.arange(0, 8)[None, :]  # [G, 8]: a scale block is 8 bytes
    codes = tl.load(Codes + rows[:, None, None] * s_cr + byte[None, :, :], mask=s_ok[:, :, None], other=0)
    sbits = tl.load(Scales + rows[:, None] * s_sr + grp[None, :], mask=s_ok, other=0)
    if HW_FP8:  # the GPU's fp8 conversion; the interpreter decodes the bits itself
        scale = sbits.to(tl.float8e4nv, bitcast=True).to(tl.float32)[:, :, None]
    else:
        scale = fp8_e4m3_to_f32(sbits)[:, :, None]
    if ASM:
        lo, hi = dequant_bf16_asm(codes, scale)
    else:
        lo, hi = dequant_portable(codes, scale, DT)
    return tl.trans(tl.reshape(lo, (lo.shape[0], KB))), tl.trans(tl.reshape(hi, (hi.shape[0], KB)))
