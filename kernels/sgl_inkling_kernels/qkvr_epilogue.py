"""Decode epilogue of the packed q/k/v/r projection: per-head q RMSNorm, the K short conv then the
per-head k RMSNorm, the V short conv, all in one launch that reads the GEMM's output row once.

Input: `qkvr [B, (NH + 2 NKV) * D + NH * R]`, one decode token per row, the output of one GEMM over
the concatenated weight [wq; wk; wv; wr]. One program per (token, head): query heads first, then
key heads, then value heads (r needs no work: the caller takes it as a view). Rounding follows the
modules: the conv runs in fp32 and is rounded to the activations' dtype, RMSNorm normalises in fp32,
rounds, then multiplies by its gain. The conv states [slots, K-1, NKV * D] (fp32) shift in place,
as `sconv.sconv_decode` does; the grid depends on shapes only (CUDA-graph safe). Given the KV
cache buffers and each token's slot, k and v go straight into the cache (no separate store kernels).

`qkvr_extend_epilogue` is the same for a few tokens a sequence (MTP's verify and draft depths, a
short prompt): one program per (sequence, head) walks the sequence's tokens in order, each step the
decode epilogue's arithmetic (so a verify's rows equal the decode steps' bit for bit), and with
MTP's capture buffers also writes each sequence's conv window (prior state, then its inputs) for
rollback. It replaced the unfused extend path's five launches (q norm, K conv, k norm, V conv, KV
store) in every verify and draft layer.
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import (
    next_pow2,
    pdl_launch,
    pdl_wait,
    require_triton,
    tl,
    triton,
    unit_stride,
)
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


@triton.jit
def _extend_stream(
    X, ConvW, State, Cap, NormW, Out, Slots, b, t0, n, col, chan, offs_d, d_ok,
    stride_xt, stride_ot, stride_ss, stride_sk, stride_cr, stride_ct, eps, PrefixLens, Rows,
    D: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    NORM: tl.constexpr, TO_CACHE: tl.constexpr, CAPTURE: tl.constexpr,
):  # fmt: skip
    """One K or V head of one sequence: its n tokens through the conv in order (the decode step's
    arithmetic each), then the k norm (NORM); the window into Cap[row] when capturing."""
    row = tl.load(Rows + b)
    offs_k = tl.arange(0, BLOCK_K)
    win = (offs_k < K - 1)[:, None] & d_ok[None, :]
    st_ptr = State + row * stride_ss + offs_k[:, None] * stride_sk + chan[None, :]
    if tl.load(PrefixLens + b) <= 0:  # a fresh sequence starts from zeros, whatever its slot holds
        tl.store(st_ptr, tl.zeros([BLOCK_K, BLOCK_D], tl.float32), mask=win)
        tl.debug_barrier()
    if CAPTURE:  # the window's first K-1 rows: the prior state
        prior = tl.load(st_ptr, mask=win, other=0.0)
        tl.store(Cap + row * stride_cr + offs_k[:, None] * stride_ct + chan[None, :], prior, mask=win)
    for t in range(n):
        x = tl.load(X + (t0 + t) * stride_xt + col + offs_d, mask=d_ok, other=0.0)
        y = _head_sconv(x, ConvW, State, row, stride_ss, stride_sk, chan, d_ok, K, BLOCK_K).to(x.dtype)
        tl.debug_barrier()  # the shifted state is what the next token reads
        if CAPTURE:
            tl.store(Cap + row * stride_cr + (K - 1 + t) * stride_ct + chan, x.to(tl.float32), mask=d_ok)
        dst = t0 + t
        if TO_CACHE:
            dst = tl.load(Slots + t0 + t)
        if NORM:
            y = _head_rmsnorm(y, NormW, offs_d, d_ok, D, eps)
        tl.store(Out + dst * stride_ot + chan, y.to(Out.dtype.element_ty), mask=d_ok)


@triton.jit
def _qkvr_extend_kernel(
    X, QNormW, KNormW, KConvW, VConvW, KState, VState, Rows, PrefixLens, ExtendLens, QStart,
    Q, Kout, Vout, Slots, KCap, VCap,
    stride_xt, stride_qt, stride_kt, stride_vt, stride_kss, stride_ksk, stride_vss, stride_vsk,
    stride_kcr, stride_kct, stride_vcr, stride_vct, eps,
    NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    K: tl.constexpr, BLOCK_K: tl.constexpr, TO_CACHE: tl.constexpr, CAPTURE: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0)
    j = tl.program_id(1)
    n = tl.load(ExtendLens + b)
    t0 = tl.load(QStart + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    if j < NH:
        for t in range(n):
            x = tl.load(X + (t0 + t) * stride_xt + j * D + offs_d, mask=d_ok, other=0.0)
            q = _head_rmsnorm(x, QNormW, offs_d, d_ok, D, eps)
            tl.store(Q + (t0 + t) * stride_qt + j * D + offs_d, q.to(Q.dtype.element_ty), mask=d_ok)
    elif j < NH + NKV:
        _extend_stream(
            X, KConvW, KState, KCap, KNormW, Kout, Slots, b, t0, n, j * D, (j - NH) * D + offs_d, offs_d, d_ok,
            stride_xt, stride_kt, stride_kss, stride_ksk, stride_kcr, stride_kct, eps, PrefixLens, Rows,
            D, K, BLOCK_K, BLOCK_D, True, TO_CACHE, CAPTURE,
        )  # fmt: skip
    else:
        _extend_stream(
            X, VConvW, VState, VCap, KNormW, Vout, Slots, b, t0, n, j * D, (j - NH - NKV) * D + offs_d, offs_d,
            d_ok, stride_xt, stride_vt, stride_vss, stride_vsk, stride_vcr, stride_vct, eps, PrefixLens, Rows,
            D, K, BLOCK_K, BLOCK_D, False, TO_CACHE, CAPTURE,
        )  # fmt: skip


def _check(qkvr, nh, nkv, d, k_conv, v_conv, k_state, v_state) -> int:
    """The row's width of r; raises on shapes the epilogue cannot take."""
    kv = nkv * d
    width = qkvr.shape[1]
    ksz = k_conv.shape[-1]
    for conv, state in ((k_conv, k_state), (v_conv, v_state)):
        if conv.shape != (kv, 1, ksz) or state.shape[1:] != (ksz - 1, kv) or state.stride(-1) != 1:
            raise ValueError(
                f"qkvr epilogue: conv {tuple(conv.shape)} / state {tuple(state.shape)} for {kv} channels"
            )
    if qkvr.stride(-1) != 1 or width <= (nh + 2 * nkv) * d or (width - (nh + 2 * nkv) * d) % nh:
        raise ValueError(f"qkvr epilogue: row width {width} does not fit {nh} heads, {nkv} KV heads of {d}")
    return (width - (nh + 2 * nkv) * d) // nh


def _outputs(qkvr, nh, nkv, d, q_norm, k_norm, kv_cache):
    """(q, k, v, slots): q, k and v new tensors for every row, or k and v the cache's buffers."""
    rows = qkvr.shape[0]
    q = torch.empty(rows, nh, d, dtype=torch.promote_types(qkvr.dtype, q_norm.dtype), device=qkvr.device)
    if kv_cache is None:
        k = torch.empty(rows, nkv, d, dtype=torch.promote_types(qkvr.dtype, k_norm.dtype), device=qkvr.device)
        return q, k, torch.empty(rows, nkv, d, dtype=qkvr.dtype, device=qkvr.device), None
    k, v, slots = kv_cache
    if any(buf.shape[1:] != (nkv, d) or buf.stride(1) != d or buf.stride(2) != 1 for buf in (k, v)):
        raise ValueError(f"qkvr epilogue: KV buffers {tuple(k.shape)} / {tuple(v.shape)} for {nkv} heads of {d}")
    return q, k, v, slots


def _launch_args(qkvr, q, k, v, k_state, v_state, nh, nkv, d, ksz, kv_cache):
    """What both kernels take after their pointers: the row strides of the input, outputs and conv
    states, and the shape and mode constants (keyword arguments)."""
    strides = (qkvr.stride(0), q.stride(0), k.stride(0), v.stride(0),
               k_state.stride(0), k_state.stride(1), v_state.stride(0), v_state.stride(1))  # fmt: skip
    meta = dict(NH=nh, NKV=nkv, D=d, BLOCK_D=next_pow2(d), K=ksz, BLOCK_K=next_pow2(ksz - 1),
                TO_CACHE=kv_cache is not None, num_warps=1, **pdl_launch(qkvr))  # fmt: skip
    return strides, meta


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
    bsz = qkvr.shape[0]
    nh, nkv, d = num_heads, num_kv_heads, head_dim
    d_rel = _check(qkvr, nh, nkv, d, k_conv, v_conv, k_state, v_state)
    ksz = k_conv.shape[-1]
    q, k, v, slots = _outputs(qkvr, nh, nkv, d, q_norm, k_norm, kv_cache)
    slots = rows if slots is None else slots
    rel = qkvr[:, (nh + 2 * nkv) * d :].view(bsz, nh, d_rel)
    if bsz:
        strides, meta = _launch_args(qkvr, q, k, v, k_state, v_state, nh, nkv, d, ksz, kv_cache)
        _qkvr_epilogue_kernel[(bsz, nh + 2 * nkv)](
            qkvr, q_norm, k_norm, k_conv, v_conv, k_state, v_state, rows, q, k, v, slots, *strides, float(eps), **meta
        )
    return (q, None, None, rel) if kv_cache is not None else (q, k, v, rel)


def qkvr_extend_epilogue(
    qkvr: torch.Tensor,  # [T, (NH + 2 NKV) * D + NH * R], sequence after sequence
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    k_conv: torch.Tensor,
    v_conv: torch.Tensor,
    k_state: torch.Tensor,
    v_state: torch.Tensor,
    rows: torch.Tensor,  # [B] conv state slot of each sequence
    prefix_lens: torch.Tensor,  # [B] (only > 0 matters: whether the state is live)
    extend_lens: torch.Tensor,  # [B]
    q_start: torch.Tensor,  # [B] each sequence's first row
    eps: float,
    kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,  # (k_buf, v_buf, slots [T])
    capture: tuple[torch.Tensor, torch.Tensor] | None = None,  # K and V windows [rows, K-1 + tokens, NKV * D]
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """qkvr_decode_epilogue for a few tokens a sequence: the same outputs for every row; each state
    ends after the sequence's last token; with `capture`, capture[i][row] also receives the K / V
    window (prior state, zeros for a fresh sequence, then the n inputs). One program walks a
    sequence's tokens: meant for short extends (the caller keeps prompts on the unfused path)."""
    require_triton()
    ntok = qkvr.shape[0]
    nh, nkv, d = num_heads, num_kv_heads, head_dim
    d_rel = _check(qkvr, nh, nkv, d, k_conv, v_conv, k_state, v_state)
    ksz = k_conv.shape[-1]
    q, k, v, slots = _outputs(qkvr, nh, nkv, d, q_norm, k_norm, kv_cache)
    if capture is not None and any(
        c.dim() != 3 or c.shape[1] < ksz or c.shape[2] != nkv * d or c.stride(2) != 1 or c.dtype != torch.float32
        for c in capture
    ):
        raise ValueError(f"qkvr epilogue: capture {[tuple(c.shape) for c in capture]} for {nkv * d} channels")
    kcap, vcap = capture if capture is not None else (k_state, v_state)  # stand-ins when not capturing
    rows, prefix_lens, extend_lens, q_start = unit_stride(rows, prefix_lens, extend_lens, q_start)
    rel = qkvr[:, (nh + 2 * nkv) * d :].view(ntok, nh, d_rel)
    if ntok:
        strides, meta = _launch_args(qkvr, q, k, v, k_state, v_state, nh, nkv, d, ksz, kv_cache)
        _qkvr_extend_kernel[(rows.shape[0], nh + 2 * nkv)](
            qkvr, q_norm, k_norm, k_conv, v_conv, k_state, v_state, rows, prefix_lens, extend_lens, q_start,
            q, k, v, slots if slots is not None else rows, kcap, vcap,
            *strides, kcap.stride(0), kcap.stride(1), vcap.stride(0), vcap.stride(1), float(eps),
            CAPTURE=capture is not None, **meta,
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
