"""Decode: a block's output short conv, the residual add and (optionally) the next RMSNorm, fused
into one launch (two with the norm), the channels split over programs.

    y = sconv(x)                  fp32, rounded to x's dtype (the ShortConv module's output)
    summed = residual + y         rounded to the dtype: the new hidden state
    normed = rmsnorm(summed)      fp32 normalise, round, times the gain (the RMSNorm module)

Both launches run a grid (B, n_blocks), one program per token and block of BLOCK_C channels: a
single program walking a whole row (~300 KB of conv state and weights at C = 6144) left the
launch latency-bound on one SM. Launch 1 does the per-channel work: conv (shifting the conv state
[slots, K-1, C] in place, as `sconv.sconv_decode`; each program touches its own channels only),
add, store `summed`, and, when a norm follows, its block's sum of squares of the rounded `summed`
into an fp32 buffer [B, n_blocks]. Launch 2 (norm only) needs the whole row's sum: each program
adds up its token's partials in one fixed reduction (no atomics: every program of a token gets
the same bits, run after run), then normalises its block of `summed`. Without a norm (the FFN
output, whose sum is the layer's output) launch 2 is skipped. The grid and every compile key
depend on the shapes' C only, never on the batch (CUDA-graph safe, no recompiles). TP 1 only:
under TP the conv runs on a reduce-scattered shard and the residual add after the all-gather.

`sconv_add_rmsnorm_extend` is launch 1 for a few tokens a sequence (MTP's verify and draft depths):
one program per (sequence, block) takes the sequence's tokens in order, each with the decode step's
arithmetic (the same bits as that many decode steps), and with MTP's capture buffer also writes the
sequence's conv window (prior state, then its inputs) for rollback; launch 2 is the same.
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import (
    interpreting,
    next_pow2,
    pdl_launch,
    pdl_wait,
    require_triton,
    tl,
    triton,
    unit_stride,
)
from sgl_inkling_kernels.moe_slots import UnsummedSlots, slot_sum
from sgl_inkling_kernels.rmsnorm import fused_add_rmsnorm_ref
from sgl_inkling_kernels.sconv import sconv_ref


@triton.jit
def _conv_add_token(
    X, ConvW, State, Res, Summed, SumSq, Ids, t, row, blk, n_blocks, offs_c, c_ok,
    stride_xb, stride_ss, stride_sk, stride_rb, stride_sb, stride_xs, num_experts,
    HAS_NORM: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr,
):  # fmt: skip
    """Token t's block: conv (shifting state row `row`), add, store summed and its sum of squares;
    returns the conv's input in fp32. SLOTS > 0: X is a MoE's slots [T, SLOTS, C]
    (moe_slots.UnsummedSlots, routed ids in Ids), summed here and rounded to the output dtype, as
    sum_slots would have stored them."""
    offs_k = tl.arange(0, BLOCK_K)
    k_ok = offs_k < K - 1
    m = k_ok[:, None] & c_ok[None, :]
    st_ptr = State + row * stride_ss + offs_k[:, None] * stride_sk + offs_c[None, :]
    hist = tl.load(st_ptr, mask=m, other=0.0)
    w_hist = tl.load(ConvW + offs_c[None, :] * K + offs_k[:, None], mask=m, other=0.0)
    w_last = tl.load(ConvW + offs_c * K + (K - 1), mask=c_ok, other=0.0)
    if SLOTS > 0:
        x = slot_sum(X, Ids, t, offs_c, c_ok, stride_xb, stride_xs, num_experts, TOPK, SLOTS)
        x = x.to(Summed.dtype.element_ty)
    else:
        x = tl.load(X + t * stride_xb + offs_c, mask=c_ok, other=0.0)
    xf = x.to(tl.float32)
    y = (xf + (tl.sum(hist * w_hist, 0) + xf * w_last)).to(x.dtype)
    res = tl.load(Res + t * stride_rb + offs_c, mask=c_ok, other=0.0)
    s = (res.to(tl.float32) + y.to(tl.float32)).to(Summed.dtype.element_ty)
    tl.store(Summed + t * stride_sb + offs_c, s, mask=c_ok)
    if HAS_NORM:
        sf = s.to(tl.float32)
        tl.store(SumSq + t * n_blocks + blk, tl.sum(tl.where(c_ok, sf * sf, 0.0), 0))
    tl.debug_barrier()  # every thread has read this block's old state before any shifts it
    tl.store(st_ptr - stride_sk, hist, mask=(k_ok & (offs_k >= 1))[:, None] & c_ok[None, :])
    tl.store(State + row * stride_ss + (K - 2) * stride_sk + offs_c, xf, mask=c_ok)
    return xf


@triton.jit
def _sconv_add_kernel(
    X, ConvW, State, Rows, Res, Summed, SumSq, Ids,
    stride_xb, stride_ss, stride_sk, stride_rb, stride_sb, stride_xs, C, num_experts,
    HAS_NORM: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
    TOPK: tl.constexpr, SLOTS: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0)
    blk = tl.program_id(1)
    offs_c = blk * BLOCK_C + tl.arange(0, BLOCK_C)
    _conv_add_token(
        X, ConvW, State, Res, Summed, SumSq, Ids, b, tl.load(Rows + b), blk, tl.num_programs(1), offs_c, offs_c < C,
        stride_xb, stride_ss, stride_sk, stride_rb, stride_sb, stride_xs, num_experts, HAS_NORM, K, BLOCK_K, TOPK, SLOTS,
    )  # fmt: skip


@triton.jit
def _sconv_add_extend_kernel(
    X, ConvW, State, Rows, PrefixLens, ExtendLens, QStart, Res, Summed, SumSq, Ids, Cap,
    stride_xb, stride_ss, stride_sk, stride_rb, stride_sb, stride_xs, stride_cr, stride_ct, C, num_experts,
    HAS_NORM: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
    TOPK: tl.constexpr, SLOTS: tl.constexpr, CAPTURE: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """One program per (sequence, block): the sequence's tokens in order, each the decode step's
    arithmetic; with CAPTURE the window (prior state, then the inputs) into Cap[row]."""
    pdl_wait(PDL)
    b = tl.program_id(0)
    blk = tl.program_id(1)
    row = tl.load(Rows + b)
    n = tl.load(ExtendLens + b)
    t0 = tl.load(QStart + b)
    offs_c = blk * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    offs_k = tl.arange(0, BLOCK_K)
    win = (offs_k < K - 1)[:, None] & c_ok[None, :]
    st_ptr = State + row * stride_ss + offs_k[:, None] * stride_sk + offs_c[None, :]
    if tl.load(PrefixLens + b) <= 0:  # a fresh sequence starts from zeros, whatever its slot holds
        tl.store(st_ptr, tl.zeros([BLOCK_K, BLOCK_C], tl.float32), mask=win)
        tl.debug_barrier()
    if CAPTURE:
        tl.store(Cap + row * stride_cr + offs_k[:, None] * stride_ct + offs_c[None, :],
                 tl.load(st_ptr, mask=win, other=0.0), mask=win)  # fmt: skip
    for i in range(n):
        xf = _conv_add_token(
            X, ConvW, State, Res, Summed, SumSq, Ids, t0 + i, row, blk, tl.num_programs(1), offs_c, c_ok,
            stride_xb, stride_ss, stride_sk, stride_rb, stride_sb, stride_xs, num_experts,
            HAS_NORM, K, BLOCK_K, TOPK, SLOTS,
        )  # fmt: skip
        tl.debug_barrier()  # the shifted state is what the next token reads
        if CAPTURE:
            tl.store(Cap + row * stride_cr + (K - 1 + i) * stride_ct + offs_c, xf, mask=c_ok)


@triton.jit
def _rmsnorm_blocks_kernel(
    Summed, SumSq, NormW, Normed, stride_sb, stride_nb, C, eps,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0)
    n_blocks = tl.num_programs(1)
    offs_n = tl.arange(0, BLOCK_N)
    part = tl.load(SumSq + b * n_blocks + offs_n, mask=offs_n < n_blocks, other=0.0)
    # The same reduction tree in every program of the token (and every run): one inv per token.
    inv = tl.rsqrt(tl.sum(part, 0) / C + eps)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    s = tl.load(Summed + b * stride_sb + offs_c, mask=c_ok, other=0.0)
    normed = (s.to(tl.float32) * inv).to(s.dtype).to(tl.float32)
    w = tl.load(NormW + offs_c, mask=c_ok, other=0.0).to(tl.float32)
    tl.store(Normed + b * stride_nb + offs_c, (normed * w).to(Normed.dtype.element_ty), mask=c_ok)


def block_c() -> int:
    """Channels per program. On the GPU 256 (4 warps, 2 channels a thread): at C = 6144 that is 24
    programs for a single token, each moving ~12 KB (as `sconv.sconv_decode`), and 1536 at batch
    64, enough to fill the SMs several times over; the norm's partials stay 24 floats a token.
    Under the interpreter 64, so tests cross several blocks and a ragged last one."""
    return 64 if interpreting() else 256


def _launch(x, conv_w, state, rows, residual, norm_w, eps, extend=None, capture=None):
    """extend: (prefix_lens, extend_lens, q_start) of a batch of short extends (one program per
    sequence and block), else one token a row of `rows`; capture: MTP's window buffer (extend only)."""
    require_triton()
    slots = x if isinstance(x, UnsummedSlots) else None
    if slots is not None and slots.dtype != residual.dtype:
        raise ValueError(f"sconv_add: slots summed to {slots.dtype}, residual {residual.dtype}")
    bsz, c = x.shape
    k = conv_w.shape[-1]
    if conv_w.shape != (c, 1, k) or state.shape[1:] != (k - 1, c) or residual.shape != x.shape:
        raise ValueError(
            f"sconv_add: x {tuple(x.shape)}, conv {tuple(conv_w.shape)}, state {tuple(state.shape)}, "
            f"residual {tuple(residual.shape)}"
        )
    if state.stride(-1) != 1 or not conv_w.is_contiguous() or state.dtype != torch.float32:
        raise ValueError("sconv_add: conv weight must be contiguous fp32 and state rows contiguous")
    if slots is None:
        x = x if x.stride(-1) == 1 else x.contiguous()
    residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    summed = torch.empty_like(residual)
    normed = None
    if norm_w is not None:
        normed = torch.empty(x.shape, dtype=torch.promote_types(summed.dtype, norm_w.dtype), device=residual.device)
    if bsz:
        bc = block_c()
        n_blocks = triton.cdiv(c, bc)  # C only: the same kernels for every batch size
        sumsq = summed  # a stand-in pointer: without a norm the kernel never touches it
        if normed is not None:
            sumsq = torch.empty((bsz, n_blocks), dtype=torch.float32, device=residual.device)
        xs, ids = (slots.out, slots.ids) if slots is not None else (x, rows)  # rows: a stand-in pointer
        common = dict(
            HAS_NORM=normed is not None, K=k, BLOCK_K=next_pow2(k - 1), BLOCK_C=bc, num_warps=4,
            TOPK=ids.shape[1] if slots is not None else 0, SLOTS=xs.shape[1] if slots is not None else 0,
            **pdl_launch(residual),
        )  # fmt: skip
        strides = (xs.stride(0), state.stride(0), state.stride(1), residual.stride(0), summed.stride(0),
                   xs.stride(1) if slots is not None else 0)  # fmt: skip
        n_experts = slots.num_experts if slots is not None else 0
        if extend is None:
            _sconv_add_kernel[(bsz, n_blocks)](
                xs, conv_w, state, rows, residual, summed, sumsq, ids, *strides, c, n_experts, **common
            )
        else:
            if capture is not None and (capture.dim() != 3 or capture.shape[1] < k or capture.shape[2] != c
                                        or capture.stride(2) != 1 or capture.dtype != torch.float32):  # fmt: skip
                raise ValueError(f"sconv_add: capture {tuple(capture.shape)} for {c} channels and a window of {k - 1}")
            cap = capture if capture is not None else state  # a stand-in pointer when not capturing
            rows, prefix_lens, extend_lens, q_start = unit_stride(rows, *extend)
            _sconv_add_extend_kernel[(rows.shape[0], n_blocks)](
                xs, conv_w, state, rows, prefix_lens, extend_lens, q_start, residual, summed, sumsq, ids, cap,
                *strides, cap.stride(0), cap.stride(1), c, n_experts, CAPTURE=capture is not None, **common,
            )  # fmt: skip
        if normed is not None:
            _rmsnorm_blocks_kernel[(bsz, n_blocks)](
                summed, sumsq, norm_w, normed, summed.stride(0), normed.stride(0), c, float(eps),
                BLOCK_N=next_pow2(n_blocks), BLOCK_C=bc, num_warps=4, **pdl_launch(residual),
            )  # fmt: skip
    return normed, summed


def sconv_add_rmsnorm_decode(
    x: torch.Tensor | UnsummedSlots,  # [B, C] the block's output (the conv's input), or a MoE's slots
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
    x: torch.Tensor | UnsummedSlots, conv_w: torch.Tensor, state: torch.Tensor, rows: torch.Tensor,
    residual: torch.Tensor,
) -> torch.Tensor:
    """residual + sconv(x), no norm; x may be a MoE's unsummed slots (summed in this launch)."""
    return _launch(x, conv_w, state, rows, residual, None, 0.0)[1]


def sconv_add_rmsnorm_extend(
    x: torch.Tensor | UnsummedSlots,  # [T, C] sequence after sequence, or a MoE's slots
    conv_w: torch.Tensor,
    state: torch.Tensor,
    rows: torch.Tensor,  # [B] conv state slot of each sequence
    prefix_lens: torch.Tensor,  # [B] (only > 0 matters: whether the state is live)
    extend_lens: torch.Tensor,  # [B]
    q_start: torch.Tensor,  # [B] each sequence's first row
    residual: torch.Tensor,  # [T, C]
    norm_w: torch.Tensor | None,  # None: no norm, (None, summed) back
    eps: float,
    capture: torch.Tensor | None = None,  # [rows, K-1 + tokens, C] fp32: receives each sequence's window
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """sconv_add_rmsnorm_decode for a few tokens a sequence (MTP's verify and draft depths): the same
    rows as that many decode steps; each state ends after its sequence's last token; with `capture`
    capture[row] also receives the window (prior state, zeros for a fresh sequence, then the inputs).
    One program walks a sequence's tokens: for short extends only."""
    return _launch(x, conv_w, state, rows, residual, norm_w, eps, (prefix_lens, extend_lens, q_start), capture)


def sconv_add_rmsnorm_decode_ref(x, conv_w, state, rows, residual, norm_w, eps):
    """Same contract from the torch references (norm_w None: (None, summed))."""
    ones = torch.ones_like(rows)
    y = sconv_ref(x, conv_w, state, rows, ones, ones)
    if norm_w is None:
        return None, residual + y
    return fused_add_rmsnorm_ref(y, residual, norm_w, eps)
