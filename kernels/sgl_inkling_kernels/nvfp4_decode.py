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
                ASM: tl.constexpr, HW_FP8: tl.constexpr, DT: tl.constexpr, MMA: tl.constexpr = False):  # fmt: skip
    """One K step of an NVFP4 weight, transposed for the dot: (lo, hi) [KB, len(rows)], the weights of
    elements 2 * kb and 2 * kb + 1 for code bytes kb0 .. kb0 + KB of `rows`. MMA: the codes are in
    nvfp4_layout's mma layout (decoded word by word, decode_words).

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
    if MMA:
        lo, hi = _dequant_mma_words(codes, scale, ASM, DT)
    elif ASM:
        lo, hi = dequant_bf16_asm(codes, scale)
    else:
        lo, hi = dequant_portable(codes, scale, DT)
    return tl.trans(tl.reshape(lo, (lo.shape[0], KB))), tl.trans(tl.reshape(hi, (hi.shape[0], KB)))


@triton.jit
def _dequant_mma_words(codes, scale, ASM: tl.constexpr, DT: tl.constexpr):
    """codes uint8 [R, G, 8] in the mma layout (two words a scale block), scale fp32 [R, G, 1] -> (lo, hi)
    [R, G, 8] in DT as dequant_bf16_asm / dequant_portable give them (elements 2j and 2j + 1 of byte j)."""
    sh = tl.arange(0, 4) * 8
    words = tl.sum(tl.reshape(codes.to(tl.int32), (codes.shape[0], codes.shape[1], 2, 4)) << sh[None, None, None, :],
                   axis=3)  # fmt: skip
    s = scale
    if ASM:  # bf16x2 of scale * 2^119, as word_scales gives it
        b = (scale * 6.646139978924579e35).to(tl.int32, bitcast=True)
        s = tl.broadcast_to((b & -65536) | ((b >> 16) & 65535), words.shape)
    e0, e1, e2, e3, e4, e5, e6, e7 = decode_words(words, s, ASM, True)
    # [R, G, 2 words, 4]: byte j of a word holds elements 2j (lo) and 2j + 1 (hi)
    lo = tl.reshape(tl.join(tl.join(e0, e4), tl.join(e2, e6)), codes.shape)
    hi = tl.reshape(tl.join(tl.join(e1, e5), tl.join(e3, e7)), codes.shape)
    return lo.to(DT), hi.to(DT)


@triton.jit
def word_scales(s_row, kw0, KW_TOT, KW: tl.constexpr, MASK_K: tl.constexpr, ASM: tl.constexpr, HW_FP8: tl.constexpr):
    """The block scale of each of KW code words (8 codes, half a 16-wide block) from word kw0 (even) of
    the rows whose scales s_row [1, R, 1] points at: [1, R, KW], for `decode_words` (fp32, or the asm
    path's bf16x2 of scale * 2^119 as int32). Each scale byte is loaded once, repeated in registers."""
    c = tl.arange(0, KW // 2)[None, None, :]
    if MASK_K:  # the last, partial K step (KW_TOT words per row)
        sbits = tl.load(s_row + kw0 // 2 + c, mask=kw0 // 2 + c < KW_TOT // 2, other=0)
    else:
        sbits = tl.load(s_row + kw0 // 2 + c)
    if HW_FP8:
        scale = sbits.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        scale = fp8_e4m3_to_f32(sbits)
    if ASM:  # bf16 of scale * 2^119 is its fp32's top half (exact: a power of two times <= 4 mantissa bits)
        b = (scale * 6.646139978924579e35).to(tl.int32, bitcast=True)
        scale = (b & -65536) | ((b >> 16) & 65535)
    return tl.reshape(tl.join(scale, scale), (1, s_row.shape[1], KW))


@triton.jit
def decode_words(words, scale, ASM: tl.constexpr, MMA: tl.constexpr = False):
    """int32 words of 8 codes (nibble j = element j of the word; MMA: nvfp4_layout's mma layout) and their
    `word_scales` -> the 8 elements' fp32 weights e0..e7, each of the words' shape: e2m1 * scale (asm
    path: * 2^-7, see module doc)."""
    if MMA:
        return _decode_mma_words(words, scale, ASM)
    if ASM:
        # Per word ($8) and its scale pair ($9): the same nibble-to-bf16 bits as dequant_bf16_asm, one
        # packed FMA by the scale per two weights, then each bf16 widened to fp32 (its top half).
        o = tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 p, q, t, u, z, r0, r1, r2, r3;
            mov.b32 z, 0x80008000;
            prmt.b32 p, $8, 0, 0x4140;
            prmt.b32 q, $8, 0, 0x4342;
            shl.b32 t, p, 12;
            shl.b32 u, p, 6;
            or.b32 t, t, u;
            and.b32 t, t, 0x81C081C0;
            fma.rn.bf16x2 r0, t, $9, z;
            and.b32 t, p, 0x00F000F0;
            mul.lo.u32 t, t, 260;
            and.b32 t, t, 0x81C081C0;
            fma.rn.bf16x2 r1, t, $9, z;
            shl.b32 t, q, 12;
            shl.b32 u, q, 6;
            or.b32 t, t, u;
            and.b32 t, t, 0x81C081C0;
            fma.rn.bf16x2 r2, t, $9, z;
            and.b32 t, q, 0x00F000F0;
            mul.lo.u32 t, t, 260;
            and.b32 t, t, 0x81C081C0;
            fma.rn.bf16x2 r3, t, $9, z;
            shl.b32 $0, r0, 16;
            shl.b32 $1, r1, 16;
            and.b32 $2, r0, 0xFFFF0000;
            and.b32 $3, r1, 0xFFFF0000;
            shl.b32 $4, r2, 16;
            shl.b32 $5, r3, 16;
            and.b32 $6, r2, 0xFFFF0000;
            and.b32 $7, r3, 0xFFFF0000;
            }
            """,
            constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r",
            args=[words, scale],
            dtype=(tl.int32,) * 8,
            is_pure=True,
            pack=1,
        )
        e0, e1, e2, e3 = o[0].to(tl.float32, bitcast=True), o[1].to(tl.float32, bitcast=True), \
            o[2].to(tl.float32, bitcast=True), o[3].to(tl.float32, bitcast=True)  # fmt: skip
        e4, e5, e6, e7 = o[4].to(tl.float32, bitcast=True), o[5].to(tl.float32, bitcast=True), \
            o[6].to(tl.float32, bitcast=True), o[7].to(tl.float32, bitcast=True)  # fmt: skip
    else:
        e0 = e2m1_to_f32(words & 15) * scale
        e1 = e2m1_to_f32((words >> 4) & 15) * scale
        e2 = e2m1_to_f32((words >> 8) & 15) * scale
        e3 = e2m1_to_f32((words >> 12) & 15) * scale
        e4 = e2m1_to_f32((words >> 16) & 15) * scale
        e5 = e2m1_to_f32((words >> 20) & 15) * scale
        e6 = e2m1_to_f32((words >> 24) & 15) * scale
        e7 = e2m1_to_f32((words >> 28) & 15) * scale
    return e0, e1, e2, e3, e4, e5, e6, e7


@triton.jit
def _mma_lane(p, lane: tl.constexpr, scale):
    """Element of lane `lane` of a pair's bits (magnitude at lane bits 6-8, sign at 15) times scale."""
    mag = (p >> (6 + 16 * lane)) & 7
    sign = (p >> (15 + 16 * lane)) & 1
    return e2m1_to_f32((mag | (sign << 3)).to(tl.int32)) * scale


@triton.jit
def _decode_mma_words(words, scale, ASM: tl.constexpr):
    """decode_words for the mma layout: pair p = (e2p, e2p+1) of a word is w & M, rotr(w, 3) & M,
    rotr(w, 6) & M or ((w & 0x001B001B) * 0x4108) & M (nvfp4_layout.py; M = 0x81C081C0)."""
    if ASM:
        o = tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 t, z, r0, r1, r2, r3;
            mov.b32 z, 0x80008000;
            and.b32 t, $8, 0x81C081C0;
            fma.rn.bf16x2 r0, t, $9, z;
            shf.r.wrap.b32 t, $8, $8, 3;
            and.b32 t, t, 0x81C081C0;
            fma.rn.bf16x2 r1, t, $9, z;
            shf.r.wrap.b32 t, $8, $8, 6;
            and.b32 t, t, 0x81C081C0;
            fma.rn.bf16x2 r2, t, $9, z;
            and.b32 t, $8, 0x001B001B;
            mul.lo.u32 t, t, 0x4108;
            and.b32 t, t, 0x81C081C0;
            fma.rn.bf16x2 r3, t, $9, z;
            shl.b32 $0, r0, 16;
            and.b32 $1, r0, 0xFFFF0000;
            shl.b32 $2, r1, 16;
            and.b32 $3, r1, 0xFFFF0000;
            shl.b32 $4, r2, 16;
            and.b32 $5, r2, 0xFFFF0000;
            shl.b32 $6, r3, 16;
            and.b32 $7, r3, 0xFFFF0000;
            }
            """,
            constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r",
            args=[words, scale],
            dtype=(tl.int32,) * 8,
            is_pure=True,
            pack=1,
        )
        return (o[0].to(tl.float32, bitcast=True), o[1].to(tl.float32, bitcast=True),
                o[2].to(tl.float32, bitcast=True), o[3].to(tl.float32, bitcast=True),
                o[4].to(tl.float32, bitcast=True), o[5].to(tl.float32, bitcast=True),
                o[6].to(tl.float32, bitcast=True), o[7].to(tl.float32, bitcast=True))  # fmt: skip
    w = words.to(tl.int64) & 0xFFFFFFFF
    m = 0x81C081C0
    p0 = w & m
    p1 = ((w >> 3) | (w << 29)) & m
    p2 = ((w >> 6) | (w << 26)) & m
    p3 = ((w & 0x001B001B) * 0x4108) & m
    return (_mma_lane(p0, 0, scale), _mma_lane(p0, 1, scale), _mma_lane(p1, 0, scale), _mma_lane(p1, 1, scale),
            _mma_lane(p2, 0, scale), _mma_lane(p2, 1, scale), _mma_lane(p3, 0, scale), _mma_lane(p3, 1, scale))  # fmt: skip
