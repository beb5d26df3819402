"""Decode: a block's output short conv, the residual add and (optionally) the next RMSNorm in one
launch, one program per token (the norm needs the whole row).

    y = sconv(x)                  fp32, rounded to x's dtype (the ShortConv module's output)
    summed = residual + y         rounded to the dtype: the new hidden state
    normed = rmsnorm(summed)      fp32 normalise, round, times the gain (the RMSNorm module)

Pass 1 walks the channels in chunks: conv (shifting the conv state [slots, K-1, C] in place, as
`sconv.sconv_decode`), add, store `summed`, accumulate its sum of squares; pass 2 reads `summed`
back and writes `normed`. Without a norm (the FFN output, whose sum is the layer's output) pass 2
is skipped. The grid depends on shapes only (CUDA-graph safe). TP 1 only: under TP the conv runs
on a reduce-scattered shard and the residual add after the all-gather.
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import interpreting, next_pow2, require_triton, tl, triton
from sgl_inkling_kernels.rmsnorm import fused_add_rmsnorm_ref
from sgl_inkling_kernels.sconv import sconv_ref


@triton.jit
def _sconv_add_rmsnorm_kernel(
    X, ConvW, State, Rows, Res, NormW, Summed, Normed,
    stride_xb, stride_ss, stride_sk, stride_rb, stride_sb, stride_nb, C, eps,
    HAS_NORM: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    row = tl.load(Rows + b)
    offs_k = tl.arange(0, BLOCK_K)
    k_ok = offs_k < K - 1
    sumsq = tl.zeros([BLOCK_C], tl.float32)
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        c_ok = offs_c < C
        m = k_ok[:, None] & c_ok[None, :]
        st_ptr = State + row * stride_ss + offs_k[:, None] * stride_sk + offs_c[None, :]
        hist = tl.load(st_ptr, mask=m, other=0.0)
        w_hist = tl.load(ConvW + offs_c[None, :] * K + offs_k[:, None], mask=m, other=0.0)
        w_last = tl.load(ConvW + offs_c * K + (K - 1), mask=c_ok, other=0.0)
        x = tl.load(X + b * stride_xb + offs_c, mask=c_ok, other=0.0)
        xf = x.to(tl.float32)
        y = (xf + (tl.sum(hist * w_hist, 0) + xf * w_last)).to(x.dtype)
        res = tl.load(Res + b * stride_rb + offs_c, mask=c_ok, other=0.0)
        s = (res.to(tl.float32) + y.to(tl.float32)).to(Summed.dtype.element_ty)
        tl.store(Summed + b * stride_sb + offs_c, s, mask=c_ok)
        sf = s.to(tl.float32)
        sumsq += tl.where(c_ok, sf * sf, 0.0)
        tl.debug_barrier()  # every thread has read this chunk's old state before any shifts it
        tl.store(st_ptr - stride_sk, hist, mask=(k_ok & (offs_k >= 1))[:, None] & c_ok[None, :])
        tl.store(State + row * stride_ss + (K - 2) * stride_sk + offs_c, xf, mask=c_ok)
    if HAS_NORM:
        inv = tl.rsqrt(tl.sum(sumsq, 0) / C + eps)
        tl.debug_barrier()  # `summed` is read back by other threads than those that wrote it
        for c0 in range(0, C, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            c_ok = offs_c < C
            s = tl.load(Summed + b * stride_sb + offs_c, mask=c_ok, other=0.0)
            normed = (s.to(tl.float32) * inv).to(s.dtype).to(tl.float32)
            w = tl.load(NormW + offs_c, mask=c_ok, other=0.0).to(tl.float32)
            tl.store(Normed + b * stride_nb + offs_c, (normed * w).to(Normed.dtype.element_ty), mask=c_ok)


def _launch(x, conv_w, state, rows, residual, norm_w, eps):
    require_triton()
    bsz, c = x.shape
    k = conv_w.shape[-1]
    if conv_w.shape != (c, 1, k) or state.shape[1:] != (k - 1, c) or residual.shape != x.shape:
        raise ValueError(
            f"sconv_add: x {tuple(x.shape)}, conv {tuple(conv_w.shape)}, state {tuple(state.shape)}, "
            f"residual {tuple(residual.shape)}"
        )
    if state.stride(-1) != 1 or not conv_w.is_contiguous() or state.dtype != torch.float32:
        raise ValueError("sconv_add: conv weight must be contiguous fp32 and state rows contiguous")
    x = x if x.stride(-1) == 1 else x.contiguous()
    residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    summed = torch.empty_like(residual)
    normed = None
    if norm_w is not None:
        normed = torch.empty(x.shape, dtype=torch.promote_types(summed.dtype, norm_w.dtype), device=x.device)
    if bsz:
        # One program streams a whole row (state and conv weights in fp32, ~300 KB at H = 6144): wide
        # chunks and 16 warps keep enough loads in flight on its SM.
        block_c = min(next_pow2(c), 64 if interpreting() else 2048)
        _sconv_add_rmsnorm_kernel[(bsz,)](
            x, conv_w, state, rows, residual, norm_w if norm_w is not None else x, summed,
            normed if normed is not None else summed,
            x.stride(0), state.stride(0), state.stride(1), residual.stride(0), summed.stride(0),
            normed.stride(0) if normed is not None else 0, c, float(eps),
            HAS_NORM=norm_w is not None, K=k, BLOCK_K=next_pow2(k - 1), BLOCK_C=block_c, num_warps=16,
        )  # fmt: skip
    return normed, summed


def sconv_add_rmsnorm_decode(
    x: torch.Tensor,  # [B, C] the block's output (the conv's input)
    conv_w: torch.Tensor,  # [C, 1, K] fp32
    state: torch.Tensor,  # [slots, K-1, C] fp32, shifted in place
    rows: torch.Tensor,  # [B] conv state slot of each token
    residual: torch.Tensor,  # [B, C] the hidden state before the block
    norm_w: torch.Tensor,  # [C] the next RMSNorm's gain
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(residual + sconv(x)), residual + sconv(x))."""
    return _launch(x, conv_w, state, rows, residual, norm_w, eps)


def sconv_add_decode(
    x: torch.Tensor, conv_w: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """residual + sconv(x), no norm."""
    return _launch(x, conv_w, state, rows, residual, None, 0.0)[1]


def sconv_add_rmsnorm_decode_ref(x, conv_w, state, rows, residual, norm_w, eps):
    """Same contract from the torch references (norm_w None: (None, summed))."""
    ones = torch.ones_like(rows)
    y = sconv_ref(x, conv_w, state, rows, ones, ones)
    if norm_w is None:
        return None, residual + y
    return fused_add_rmsnorm_ref(y, residual, norm_w, eps)
