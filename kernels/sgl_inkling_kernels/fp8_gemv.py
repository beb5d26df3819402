"""W8A16 GEMV for FP8 draft weights (`--speculative-draft-model-quantization fp8`): y[t, n] = (x[t] .
codes[n]) * scale[n], fp8 e4m3 weight codes with one fp32 scale per output row, fp32 accumulation,
rounded to x's dtype.

Why: an MTP depth reads its whole dense layer for every drafted token (1.32 GB of BF16 at Inkling's
width), so the draft step is weight streaming; one byte a weight halves it. An e4m3 code widens to
bf16 exactly (bf16 has e4m3's exponent range and more mantissa), so the dot runs on the tensor cores
in bf16 and the row scale is applied once to the fp32 sum.

The form is dense_gemv's (its `band_dot` loop): each program streams a band of BLOCK_N weight rows over the whole K with 16
tokens as the MMA operand, the first PRE_K columns loaded before `pdl_wait` (the weights are no
earlier kernel's output). Larger batches take more token tiles (the fastest grid axis, so the
programs of one band run side by side and re-read it from L2 rather than HBM). Narrow outputs (a depth's down projection: 6144 rows over 24576 columns)
take 32-row bands so the grid still covers the SMs. In the interpreter (no fp8 type) the codes are
read as bytes and decoded by integer arithmetic (exact); on the GPU by the hardware conversion.
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import dot_mode, interpreting, pdl_launch, require_triton, tl, triton
from sgl_inkling_kernels.dense_gemv import band_dot

TOKEN_TILE = 16  # tl.dot takes at least 16 rows
MAX_TOKENS = 64  # above: the callers dequantize and run one GEMM (prefill)
NARROW_N = 8192  # at most this many rows: 32-row bands


@triton.jit(do_not_specialize=["T"])
def _fp8_gemv_kernel(
    X, W, S, Y, T, N, K,
    stride_xt, stride_wn, stride_yt,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE_K: tl.constexpr,
    HW_FP8: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    t_ok = offs_t < T
    n_ok = offs_n < N
    acc = band_dot(X + offs_t[:, None] * stride_xt, W + offs_n[:, None] * stride_wn, t_ok, n_ok, K,
                   BLOCK_T, BLOCK_N, BLOCK_K, PRE_K, True, HW_FP8, UPCAST, PREC, PDL)  # fmt: skip
    scale = tl.load(S + offs_n, mask=n_ok, other=0.0)
    y = acc * scale[None, :]
    tl.store(Y + offs_t[:, None] * stride_yt + offs_n[None, :], y.to(Y.dtype.element_ty),
             mask=t_ok[:, None] & n_ok[None, :])  # fmt: skip


def applies(x: torch.Tensor, codes: torch.Tensor) -> bool:
    """Whether `fp8_gemv` serves x against these codes: 1..MAX_TOKENS contiguous rows of a float x,
    contiguous fp8 rows of x's width."""
    return (
        x.dim() == 2
        and 0 < x.shape[0] <= MAX_TOKENS
        and x.dtype.is_floating_point
        and codes.dtype == torch.float8_e4m3fn
        and codes.dim() == 2
        and x.shape[1] == codes.shape[1]
        and x.stride(1) == 1
        and codes.stride(1) == 1
    )


def fp8_gemv(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, block_n: int | None = None) -> torch.Tensor:
    """x [T, K] against codes [N, K] (float8_e4m3fn) with scale [N] (fp32) -> [T, N] in x's dtype,
    for T <= MAX_TOKENS. `block_n`: the row band (tests; default by N)."""
    require_triton()
    if not applies(x, codes) or scale.shape != (codes.shape[0],) or scale.dtype != torch.float32:
        raise ValueError(f"fp8_gemv: x {tuple(x.shape)} {x.dtype}, codes {tuple(codes.shape)} {codes.dtype}, "
                         f"scale {tuple(scale.shape)} {scale.dtype} (1..{MAX_TOKENS} rows, fp8 codes, "
                         "one fp32 scale a row)")  # fmt: skip
    t, k = x.shape
    n = codes.shape[0]
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    block_n = block_n or (32 if n <= NARROW_N else 64)
    block_k, pre_k = (64, 64) if interpreting() else (256, 256)  # the interpreter: small tiles, quick tests
    upcast, prec = dot_mode(x.dtype)
    hw = not interpreting()
    # Token tiles on the fastest grid axis: the programs sharing a band run together and read it once from HBM.
    grid = (triton.cdiv(t, TOKEN_TILE), triton.cdiv(n, block_n))
    _fp8_gemv_kernel[grid](
        x, codes.view(torch.uint8), scale, out, t, n, k,
        x.stride(0), codes.stride(0), out.stride(0),
        BLOCK_T=TOKEN_TILE, BLOCK_N=block_n, BLOCK_K=block_k, PRE_K=pre_k, HW_FP8=hw, UPCAST=upcast, PREC=prec,
        num_warps=4, num_stages=3, **pdl_launch(x),
    )  # fmt: skip
    return out
