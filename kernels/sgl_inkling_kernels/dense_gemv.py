"""The dense BF16 projections of a decode step at a few tokens (the packed q/k/v/r GEMM and the attention
output projection) as one Triton GEMV: y[t, n] = x[t] . w[n], fp32 accumulation, rounded to x's dtype.

Why not cuBLAS: at batch 1 the layer is a chain of short kernels between the weight streams, and each
launch boundary costs the drain of one kernel and the ramp of the next. The Triton kernels of the chain
launch as programmatic dependents (_triton.pdl_launch), which a cuBLAS launch cannot be: its
predecessor must finish before it launches, and its successor cannot launch before it ends. Here the
programs become resident while the previous kernel (a norm, decode attention's merge) still runs and
load their first PRE_K weight columns, which no earlier kernel writes, before `pdl_wait`; the
activations are read after it.

Each program streams a band of BLOCK_N weight rows over the whole K with the tokens as a 16-row MMA
operand (the sink experts' GEMV form, sink_gemv.py). Grids depend on shapes only (CUDA-graph safe) and
T is not specialised: one compile per (N, K) shape covers every batch of 1..MAX_TOKENS tokens.
Tiles from benchmark/bench_dense_gemv.py on an H100 (results/diagnostics/dense_gemv_h100_*): bands of
64 rows, 256-column K steps in 3 stages, the first 256 columns before the wait. Bands that split N
evenly over the SMs (one program an SM, 104 rows of 128 for 13312) were as fast alone but made the
layer 4% slower, and 32-row bands were 16% slower than cuBLAS on 13312 x 6144.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from sgl_inkling_kernels._triton import (
    dot_mode,
    interpreting,
    mm,
    pdl_launch,
    pdl_wait,
    require_triton,
    tl,
    triton,
)
from sgl_inkling_kernels.nvfp4_decode import fp8_e4m3_to_f32

MAX_TOKENS = 16  # one token tile: tl.dot takes at least 16 rows


@dataclass(frozen=True)
class GemvTiles:
    """A launch's shape: rows per program, the K step, weight columns loaded before the wait (0: none;
    a power of two), pipeline stages and warps."""

    block_n: int = 64
    block_k: int = 256
    pre_k: int = 256
    num_stages: int = 3
    num_warps: int = 4

    @classmethod
    def parse(cls, spec: str) -> GemvTiles:
        """From 'block_n,block_k,pre_k,num_stages,num_warps' (benchmarks' command lines)."""
        return cls(*(int(x) for x in spec.split(",")))


TILES = GemvTiles()

_ENABLED = True  # decode projections through this GEMV where it applies (see `applies`)


@contextlib.contextmanager
def cublas_projections() -> Iterator[None]:
    """Within the block, decode projections go through cuBLAS (F.linear) as before this kernel: the
    "before" of benchmarks; graphs captured inside keep it."""
    global _ENABLED
    saved, _ENABLED = _ENABLED, False
    try:
        yield
    finally:
        _ENABLED = saved


@contextlib.contextmanager
def gemv_tiles(tiles: GemvTiles) -> Iterator[None]:
    """Within the block, launches use `tiles` (benchmarks' sweeps)."""
    global TILES
    saved, TILES = TILES, tiles
    try:
        yield
    finally:
        TILES = saved


@triton.jit(do_not_specialize=["T"])
def _dense_gemv_kernel(
    X, W, Y, T, N, K,
    stride_xt, stride_wn, stride_yt,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE_K: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    offs_t = tl.arange(0, BLOCK_T)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    t_ok = offs_t < T
    n_ok = offs_n < N
    acc = band_dot(X + offs_t[:, None] * stride_xt, W + offs_n[:, None] * stride_wn, t_ok, n_ok, K,
                   BLOCK_T, BLOCK_N, BLOCK_K, PRE_K, False, False, UPCAST, PREC, PDL)  # fmt: skip
    tl.store(Y + offs_t[:, None] * stride_yt + offs_n[None, :], acc.to(Y.dtype.element_ty),
             mask=t_ok[:, None] & n_ok[None, :])  # fmt: skip


@triton.jit
def band_dot(
    x_rows, w_rows, t_ok, n_ok, K,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE_K: tl.constexpr,
    W_FP8: tl.constexpr, HW_FP8: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The tokens x_rows [BLOCK_T, 1] against the band of weight rows w_rows [BLOCK_N, 1] over all K
    columns, as an fp32 [BLOCK_T, BLOCK_N] tile; the first PRE_K weight columns are loaded before
    `pdl_wait`. W_FP8: the weights are e4m3 bytes (fp8_gemv.py), widened exactly to x's dtype by the
    GPU's conversion (HW_FP8) or by integer arithmetic (the interpreter)."""
    acc = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
    if PRE_K > 0:
        # The weights are no earlier kernel's output: in flight while the previous kernel finishes.
        offs_p = tl.arange(0, PRE_K)
        p_ok = offs_p < K
        w_pre = tl.load(w_rows + offs_p[None, :], mask=n_ok[:, None] & p_ok[None, :], other=0.0)
    pdl_wait(PDL)
    if PRE_K > 0:
        x_pre = tl.load(x_rows + offs_p[None, :], mask=t_ok[:, None] & p_ok[None, :], other=0.0)
        if W_FP8:
            w_pre = _widen_e4m3(w_pre, x_pre, HW_FP8)
        acc += mm(x_pre, tl.trans(w_pre), UPCAST, PREC)
    for k0 in range(PRE_K, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(x_rows + offs_k[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if W_FP8:
            w = _widen_e4m3(w, x, HW_FP8)
        acc += mm(x, tl.trans(w), UPCAST, PREC)
    return acc


@triton.jit
def _widen_e4m3(codes, x, HW_FP8: tl.constexpr):
    """e4m3 codes (bytes) -> x's dtype, exactly."""
    if HW_FP8:
        return codes.to(tl.float8e4nv, bitcast=True).to(x.dtype)
    return fp8_e4m3_to_f32(codes).to(x.dtype)


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `dense_gemv` serves x @ weight.T: at most MAX_TOKENS rows of x, contiguous rows in both
    and one floating dtype (the callers' other case is F.linear)."""
    return (
        _ENABLED
        and x.dim() == 2
        and 0 < x.shape[0] <= MAX_TOKENS
        and x.dtype == weight.dtype
        and x.dtype.is_floating_point
        and weight.dim() == 2
        and x.shape[1] == weight.shape[1]
        and x.stride(1) == 1
        and weight.stride(1) == 1
    )


def dense_gemv(x: torch.Tensor, weight: torch.Tensor, tiles: GemvTiles | None = None) -> torch.Tensor:
    """x [T, K] @ weight[N, K].T -> [T, N] in x's dtype, for T <= MAX_TOKENS."""
    require_triton()
    if not applies(x, weight) and not (x.dim() == 2 and x.shape[0] == 0):
        raise ValueError(f"dense_gemv: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype} "
                         f"(at most {MAX_TOKENS} rows, contiguous rows, one dtype)")  # fmt: skip
    tiles = tiles or TILES
    t, k = x.shape
    n = weight.shape[0]
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    block_k, pre_k = tiles.block_k, tiles.pre_k
    if interpreting():  # numpy underneath: small tiles keep CPU tests quick and still cover the masks
        block_k, pre_k = min(block_k, 64), min(pre_k, 64)
    upcast, prec = dot_mode(x.dtype)
    _dense_gemv_kernel[(triton.cdiv(n, tiles.block_n),)](
        x, weight, out, t, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_T=MAX_TOKENS, BLOCK_N=tiles.block_n, BLOCK_K=block_k, PRE_K=pre_k, UPCAST=upcast, PREC=prec,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_launch(x),
    )  # fmt: skip
    return out

