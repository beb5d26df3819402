"""Row-block GEMVs for the small-M (decode) path of the NVFP4 MoE, without tl.dot (Triton helpers).

A program multiplies R weight rows by BM activation rows. Per K step it streams the rows' codes as
int32 words (8 codes, one 16-byte load per 4 words), decodes them in registers (nvfp4_decode) and
multiplies by the activations with fp32 FMAs into a [BM, R, KW] accumulator whose K axis is summed
only once, after the loop: the products need no shuffles, and each activation value a thread loads
serves every row it holds. At decode an expert gets one or two rows, so there is nothing for an MMA
to share, and every weight is used BM times at most: what counts is bytes in flight and few
instructions per weight, not operand reuse.
"""

from __future__ import annotations

from sgl_inkling_kernels._triton import tl, triton
from sgl_inkling_kernels.nvfp4_decode import decode_words, word_scales


@triton.jit
def _split8(x):
    """[BM, KW * 8] activations -> the 8 [BM, 1, KW] tensors of elements 8w + j, j = 0..7."""
    x = tl.reshape(x, (x.shape[0], x.shape[1] // 8, 2, 2, 2))  # element 8w + 4a + 2b + c
    x_c0, x_c1 = tl.split(x)
    x00, x01 = tl.split(x_c0)  # c = 0, b = 0 / 1
    x10, x11 = tl.split(x_c1)
    x0, x4 = tl.split(x00)
    x2, x6 = tl.split(x01)
    x1, x5 = tl.split(x10)
    x3, x7 = tl.split(x11)
    return x0[:, None, :], x1[:, None, :], x2[:, None, :], x3[:, None, :], x4[:, None, :], x5[:, None, :], \
        x6[:, None, :], x7[:, None, :]  # fmt: skip


@triton.jit
def _nvfp4_step(acc, a_row, c_row, s_row, kw0, KW_TOT, KW: tl.constexpr, MASK_K: tl.constexpr, ASM: tl.constexpr,
                HW_FP8: tl.constexpr, FIRST: tl.constexpr):  # fmt: skip
    """acc + this K step's products [BM, R, KW]; FIRST: the products alone (acc is ignored).

    The weights are [1, R, KW] and the activations [BM, 1, KW]: the products take the weights' register
    layout (the code load's), so only the few activations move between layouts."""
    w = tl.arange(0, KW)[None, None, :]
    k8 = tl.arange(0, 8 * KW)[None, :]
    if MASK_K:
        words = tl.load(c_row + kw0 + w, mask=kw0 + w < KW_TOT, other=0)
        a = tl.load(a_row + 8 * kw0 + k8, mask=8 * kw0 + k8 < 8 * KW_TOT, other=0.0)
    else:
        words = tl.load(c_row + kw0 + w)
        a = tl.load(a_row + 8 * kw0 + k8)
    scale = word_scales(s_row, kw0, KW_TOT, KW, MASK_K, ASM, HW_FP8)
    e0, e1, e2, e3, e4, e5, e6, e7 = decode_words(words, scale, ASM)
    x0, x1, x2, x3, x4, x5, x6, x7 = _split8(a.to(tl.float32))
    p = e0 * x0
    if FIRST:
        acc = p
    else:
        acc += p
    acc += e1 * x1
    acc += e2 * x2
    acc += e3 * x3
    acc += e4 * x4
    acc += e5 * x5
    acc += e6 * x6
    acc += e7 * x7
    return acc


@triton.jit
def nvfp4_gemv(a_row, Codes, Scales, rows, s_cr, s_sr, K, KW: tl.constexpr, ASM: tl.constexpr, HW_FP8: tl.constexpr):
    """[BM, R] fp32: activations (a_row: [BM, 1] pointers to each row's element 0, K of them) times
    the NVFP4 weight rows `rows` (Codes: int32 words, s_cr words per row; Scales: fp8 bytes)."""
    KW_TOT = K // 8
    c_row = Codes + rows[None, :, None] * s_cr
    s_row = Scales + rows[None, :, None] * s_sr
    # The first step starts the accumulator (masked, in case K is shorter than a step), so that it has
    # the products' layout: a zero-initialised one would get a default layout, and every step's
    # weights would cross shared memory to meet it.
    acc = _nvfp4_step(0.0, a_row, c_row, s_row, 0, KW_TOT, KW, True, ASM, HW_FP8, True)
    full = KW_TOT // KW * KW  # whole K steps unmasked (vector loads); the rest is one masked step
    for kw0 in range(KW, full, KW):
        acc = _nvfp4_step(acc, a_row, c_row, s_row, kw0, KW_TOT, KW, False, ASM, HW_FP8, False)
    if (full < KW_TOT) & (full > 0):
        acc = _nvfp4_step(acc, a_row, c_row, s_row, full, KW_TOT, KW, True, ASM, HW_FP8, False)
    return tl.sum(acc, 2)


@triton.jit
def _bf16_step(acc, a_row, w_row, k0, K, KW: tl.constexpr, MASK_K: tl.constexpr, FIRST: tl.constexpr):
    k = (tl.arange(0, KW)[:, None] * 8 + tl.arange(0, 8)[None, :])[None, None, :, :]  # [1, 1, KW, 8]
    if MASK_K:
        wt = tl.load(w_row[:, :, :, None] + k0 + k, mask=k0 + k < K, other=0.0)
        a = tl.load(a_row[:, :, :, None] + k0 + k, mask=k0 + k < K, other=0.0)
    else:
        wt = tl.load(w_row[:, :, :, None] + k0 + k)
        a = tl.load(a_row[:, :, :, None] + k0 + k)
    p = tl.sum(wt.to(tl.float32) * a.to(tl.float32), 3)  # [BM, R, KW]: within a thread's 8 elements
    if FIRST:
        acc = p
    else:
        acc += p
    return acc


@triton.jit
def bf16_gemv(a_row, W, rows, s_wr, K, KW: tl.constexpr):
    """[BM, R] fp32: activations (a_row [BM, 1]) times dense weight rows `rows` of W (s_wr elements per
    row), 8 * KW elements (16-byte loads of 8) per K step; the weights [1, R, KW, 8] set the layout."""
    w_row = W + rows[None, :, None] * s_wr
    a3 = a_row[:, :, None]
    acc = _bf16_step(0.0, a3, w_row, 0, K, KW, True, True)
    full = K // (8 * KW) * (8 * KW)
    for k0 in range(8 * KW, full, 8 * KW):
        acc = _bf16_step(acc, a3, w_row, k0, K, KW, False, False)
    if (full < K) & (full > 0):
        acc = _bf16_step(acc, a3, w_row, full, K, KW, True, False)
    return tl.sum(acc, 2)
