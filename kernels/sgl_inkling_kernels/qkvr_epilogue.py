"""Decode epilogue of the packed q/k/v/r projection: per-head q RMSNorm, the K short conv then the
per-head k RMSNorm, the V short conv, all in one launch that reads the GEMM's output row once.

Input: `qkvr [B, (NH + 2 NKV) * D + NH * R]`, one decode token per row, the output of one GEMM over
the concatenated weight [wq; wk; wv; wr]. One program per (token, head): query heads first, then
key heads, then value heads (r needs no work: the caller takes it as a view). Rounding follows the
modules: the conv runs in fp32 and is rounded to the activations' dtype, RMSNorm normalises in fp32,
rounds, then multiplies by its gain. The conv states [slots, K-1, NKV * D] (fp32) shift in place,
as `sconv.sconv_decode` does; the grid depends on shapes only (CUDA-graph safe). Given the KV
cache buffers and each token's slot, k and v go straight into the cache (no separate store kernels).
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import next_pow2, pdl_launch, pdl_wait, require_triton, tl, triton
from sgl_inkling_kernels.rmsnorm import rmsnorm_ref
from sgl_inkling_kernels.sconv import sconv_ref


@triton.jit
def _head_rmsnorm(x, W, offs_d, d_ok, D: tl.constexpr, eps):
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / D + eps)
    normed = (xf * inv).to(x.dtype).to(tl.float32)
    return normed * tl.load(W + offs_d, mask=d_ok, other=0.0).to(tl.float32)


@triton.jit
def _head_sconv(
    x, ConvW, State, row, stride_ss, stride_sk, chan, c_ok, K: tl.constexpr, BLOCK_K: tl.constexpr
):
    """y = x + conv over [state, x] for one head's channels; shifts the state; y in fp32."""
    offs_k = tl.arange(0, BLOCK_K)
    k_ok = offs_k < K - 1
    st_ptr = State + row * stride_ss + offs_k[:, None] * stride_sk + chan[None, :]
    m = k_ok[:, None] & c_ok[None, :]
    hist = tl.load(st_ptr, mask=m, other=0.0)
    w_hist = tl.load(ConvW + chan[None, :] * K + offs_k[:, None], mask=m, other=0.0)
    w_last = tl.load(ConvW + chan * K + (K - 1), mask=c_ok, other=0.0)
    xf = x.to(tl.float32)
    y = xf + (tl.sum(hist * w_hist, 0) + xf * w_last)
    tl.debug_barrier()  # every thread has read the old state before any shifts it
    tl.store(st_ptr - stride_sk, hist, mask=(k_ok & (offs_k >= 1))[:, None] & c_ok[None, :])
    tl.store(State + row * stride_ss + (K - 2) * stride_sk + chan, xf, mask=c_ok)
    return y


@triton.jit
def _qkvr_epilogue_kernel(
    X, QNormW, KNormW, KConvW, VConvW, KState, VState, Rows, Q, Kout, Vout, Slots,
    stride_xb, stride_qb, stride_kb, stride_vb, stride_kss, stride_ksk, stride_vss, stride_vsk, eps,
    NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    K: tl.constexpr, BLOCK_K: tl.constexpr, TO_CACHE: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0)
    j = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    x = tl.load(X + b * stride_xb + j * D + offs_d, mask=d_ok, other=0.0)
    dst = b  # the k / v output row: the token's row, or its KV cache slot
    if TO_CACHE:
        dst = tl.load(Slots + b)
    if j < NH:
        q = _head_rmsnorm(x, QNormW, offs_d, d_ok, D, eps)
        tl.store(Q + b * stride_qb + j * D + offs_d, q.to(Q.dtype.element_ty), mask=d_ok)
    elif j < NH + NKV:
        chan = (j - NH) * D + offs_d
        row = tl.load(Rows + b)
        # Branch-local names: Triton unifies the types of a name assigned in several branches.
        conv_k = _head_sconv(x, KConvW, KState, row, stride_kss, stride_ksk, chan, d_ok, K, BLOCK_K).to(x.dtype)
        normed_k = _head_rmsnorm(conv_k, KNormW, offs_d, d_ok, D, eps)
        tl.store(Kout + dst * stride_kb + chan, normed_k.to(Kout.dtype.element_ty), mask=d_ok)
    else:
        chan = (j - NH - NKV) * D + offs_d
        row = tl.load(Rows + b)
        conv_v = _head_sconv(x, VConvW, VState, row, stride_vss, stride_vsk, chan, d_ok, K, BLOCK_K)
        tl.store(Vout + dst * stride_vb + chan, conv_v.to(Vout.dtype.element_ty), mask=d_ok)


def qkvr_decode_epilogue(
    qkvr: torch.Tensor,  # [B, (NH + 2 NKV) * D + NH * R]
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_norm: torch.Tensor,  # [D] gains
    k_norm: torch.Tensor,
    k_conv: torch.Tensor,  # [NKV * D, 1, K] fp32
    v_conv: torch.Tensor,
    k_state: torch.Tensor,  # [slots, K-1, NKV * D] fp32, shifted in place
    v_state: torch.Tensor,
    rows: torch.Tensor,  # [B] conv state slot of each token
    eps: float,
    kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,  # (k_buf, v_buf, slots [B])
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """(q [B, NH, D], k [B, NKV, D], v [B, NKV, D], rel [B, NH, R] a view of qkvr). With `kv_cache`
    ([slots, NKV, D] buffers with contiguous slots), k and v are stored at the given slots instead
    and returned as None."""
    require_triton()
    bsz, width = qkvr.shape
    nh, nkv, d = num_heads, num_kv_heads, head_dim
    kv = nkv * d
    d_rel = (width - (nh + 2 * nkv) * d) // nh
    ksz = k_conv.shape[-1]
    for conv, state in ((k_conv, k_state), (v_conv, v_state)):
        if conv.shape != (kv, 1, ksz) or state.shape[1:] != (ksz - 1, kv) or state.stride(-1) != 1:
            raise ValueError(
                f"qkvr epilogue: conv {tuple(conv.shape)} / state {tuple(state.shape)} for {kv} channels"
            )
    if qkvr.stride(-1) != 1 or d_rel <= 0 or (width - (nh + 2 * nkv) * d) % nh:
        raise ValueError(f"qkvr epilogue: row width {width} does not fit {nh} heads, {nkv} KV heads of {d}")
    out_q = torch.promote_types(qkvr.dtype, q_norm.dtype)
    out_k = torch.promote_types(qkvr.dtype, k_norm.dtype)
    q = torch.empty(bsz, nh, d, dtype=out_q, device=qkvr.device)
    if kv_cache is None:
        k = torch.empty(bsz, nkv, d, dtype=out_k, device=qkvr.device)
        v = torch.empty(bsz, nkv, d, dtype=qkvr.dtype, device=qkvr.device)
        slots = rows
    else:
        k, v, slots = kv_cache
        if any(buf.shape[1:] != (nkv, d) or buf.stride(1) != d or buf.stride(2) != 1 for buf in (k, v)):
            raise ValueError(f"qkvr epilogue: KV buffers {tuple(k.shape)} / {tuple(v.shape)} for {nkv} heads of {d}")
    rel = qkvr[:, (nh + 2 * nkv) * d :].view(bsz, nh, d_rel)
    if bsz:
        _qkvr_epilogue_kernel[(bsz, nh + 2 * nkv)](
            qkvr, q_norm, k_norm, k_conv, v_conv, k_state, v_state, rows, q, k, v, slots,
            qkvr.stride(0), q.stride(0), k.stride(0), v.stride(0),
            k_state.stride(0), k_state.stride(1), v_state.stride(0), v_state.stride(1), float(eps),
            NH=nh, NKV=nkv, D=d, BLOCK_D=next_pow2(d), K=ksz, BLOCK_K=next_pow2(ksz - 1),
            TO_CACHE=kv_cache is not None, num_warps=1, **pdl_launch(qkvr),
        )  # fmt: skip
    return (q, None, None, rel) if kv_cache is not None else (q, k, v, rel)


def qkvr_decode_epilogue_ref(
    qkvr, num_heads, num_kv_heads, head_dim, q_norm, k_norm, k_conv, v_conv, k_state, v_state, rows, eps
):
    """Same contract, composed from the torch references of RMSNorm and the short conv."""
    bsz = qkvr.shape[0]
    nh, nkv, d = num_heads, num_kv_heads, head_dim
    kv = nkv * d
    q_raw, k_raw, v_raw, r = qkvr.split([nh * d, kv, kv, qkvr.shape[1] - nh * d - 2 * kv], dim=1)
    ones = torch.ones_like(rows)
    q = rmsnorm_ref(q_raw.reshape(bsz, nh, d), q_norm, eps)
    k = rmsnorm_ref(sconv_ref(k_raw, k_conv, k_state, rows, ones, ones).view(bsz, nkv, d), k_norm, eps)
    v = sconv_ref(v_raw, v_conv, v_state, rows, ones, ones).view(bsz, nkv, d)
    return q, k, v, r.reshape(bsz, nh, -1)
