"""Paged extend attention for Inkling: the new tokens of each sequence attend to its cached prefix
and to each other (causal), reading every key through the req-to-token table.

The backend stores the new tokens' K/V in the pool first, so prefix and new keys are read alike.
One program owns BLOCK_M query tokens x all query heads of one KV head (rows = token-major,
head-minor), so each K/V block feeds the whole GQA group. The relative bias is gathered from the
table per key block: a row's distances t - s are consecutive, so each table row is read as a
contiguous (reversed) run; no [T, heads, extent] tensor is materialised. Extend is not captured in a
CUDA graph, so the grid may use the host's view of the longest extension.
Reference: `attention_ref.paged_attention_ref`.
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import (
    dot_mode,
    interpreting,
    mm,
    next_pow2,
    require_triton,
    tl,
    triton,
    unit_stride,
)
from sgl_inkling_kernels.attention_ref import paged_attention_ref
from sgl_inkling_kernels.paged_kv import paged_kv_block


@triton.jit
def _extend_kernel(
    Q, K, V, ReqToTok, ReqIdx, PrefixLens, ExtendLens, QStart, Rel, Table, Tau, Out,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_rt,
    stride_relt, stride_relh, stride_tab, stride_ot,
    scaling, extent, window,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, R: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_TAU: tl.constexpr, HAS_WINDOW: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    mb = tl.program_id(1)
    kh = tl.program_id(2)
    n_new = tl.load(ExtendLens + b)
    if mb * BLOCK_M >= n_new:
        return
    prefix = tl.load(PrefixLens + b)
    q0 = tl.load(QStart + b)
    row = tl.load(ReqIdx + b)

    ROWS: tl.constexpr = BLOCK_M * BLOCK_G
    offs = tl.arange(0, ROWS)
    tok = mb * BLOCK_M + offs // BLOCK_G  # token index within this sequence's new tokens
    g = offs % BLOCK_G
    row_ok = (tok < n_new) & (g < G)
    head = kh * G + g
    qpos = prefix + tok  # absolute position of each row's query
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(Q + (q0 + tok)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    rel_ptr = Rel + (q0 + tok) * stride_relt + head * stride_relh
    qk_scale = scaling * 1.4426950408889634  # log2 units: the softmax uses exp2
    bias_scale = tl.full([ROWS], 1.4426950408889634, tl.float32)
    if HAS_TAU:
        bias_scale = tl.load(Tau + q0 + tok, mask=row_ok, other=1.0).to(tl.float32) * 1.4426950408889634

    # Keys any row of this block can see: the union of the rows' windows, up to the last query.
    first = prefix + mb * BLOCK_M
    last = prefix + tl.minimum(n_new, (mb + 1) * BLOCK_M) - 1
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(first - window + 1, 0)
    hi = last + 1

    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for s0 in range(lo, hi, BLOCK_N):
        offs_n = s0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        k, v = paged_kv_block(K, V, ReqToTok, row, kh, offs_n, n_ok, offs_d, d_ok, stride_ks, stride_kh, stride_vs,
                              stride_vh, stride_rt)  # fmt: skip
        qk = mm(q, tl.trans(k), UPCAST, PREC)  # [ROWS, BLOCK_N]
        dist = qpos[:, None] - offs_n[None, :]
        visible = (dist >= 0) & n_ok[None, :] & row_ok[:, None]
        if HAS_WINDOW:
            visible = visible & (dist < window)
        in_table = visible & (dist < extent)
        bias = tl.zeros([ROWS, BLOCK_N], tl.float32)
        for e in tl.static_range(R):
            r_e = tl.load(rel_ptr + e, mask=row_ok, other=0.0).to(tl.float32)
            p_e = tl.load(Table + e * stride_tab + dist, mask=in_table, other=0.0).to(tl.float32)
            bias += r_e[:, None] * p_e
        s = qk * qk_scale + bias * bias_scale[:, None]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows with nothing visible yet keep m = -inf; shift by 0 there to avoid inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, UPCAST, PREC)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + (q0 + tok)[:, None] * stride_ot + head[:, None] * D + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])  # fmt: skip


def extend_attention(
    q: torch.Tensor,  # [T, heads, head_dim] new tokens, sequence after sequence
    k_buf: torch.Tensor,  # [slots, kv_heads, head_dim] (new tokens' keys already stored)
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,  # [rows, max_context] int
    req_pool_indices: torch.Tensor,  # [B]
    prefix_lens: torch.Tensor,  # [B]
    extend_lens: torch.Tensor,  # [B]
    rel: torch.Tensor,  # [T, heads, d_rel]
    rel_table: torch.Tensor,  # [d_rel, extent]
    tau: torch.Tensor | None,  # [T]
    scaling: float,
    window: int | None,
    max_extend_len: int,  # host-side max(extend_lens): sizes the grid
    q_start: torch.Tensor | None = None,  # [B] first row of each sequence in q (exclusive cumsum)
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Attention output [T, heads * head_dim] in q's dtype."""
    require_triton()
    t_total, heads, dim = q.shape
    kv_heads = k_buf.shape[1]
    groups = heads // kv_heads
    d_rel, extent = rel_table.shape
    block_g = next_pow2(groups)
    wide = q.dtype == torch.float32  # fp32 tiles need twice the shared memory: halve them
    if block_m is None:
        # About 128 (token, head) rows per program on the GPU; small tiles in the interpreter.
        block_m = max(1, (16 if interpreting() else (32 if wide else 128)) // block_g)
    block_m = next_pow2(block_m)
    block_m = max(block_m, -(-16 // block_g))  # tl.dot wants at least 16 rows
    if block_n is None:
        block_n = 16 if interpreting() else (32 if wide else 64)
    if q_start is None:
        q_start = torch.cumsum(extend_lens, 0) - extend_lens
    req_pool_indices, prefix_lens, extend_lens, q_start = unit_stride(req_pool_indices, prefix_lens, extend_lens,
                                                                      q_start)  # fmt: skip
    q = q.contiguous() if q.stride(-1) != 1 else q
    rel = rel.contiguous() if rel.stride(-1) != 1 else rel
    rel_table = rel_table.contiguous()
    out = torch.empty(t_total, heads * dim, dtype=q.dtype, device=q.device)
    if t_total == 0:
        return out
    upcast, prec = dot_mode(q.dtype)
    grid = (req_pool_indices.shape[0], triton.cdiv(max_extend_len, block_m), kv_heads)
    _extend_kernel[grid](
        q, k_buf, v_buf, req_to_token, req_pool_indices, prefix_lens, extend_lens, q_start,
        rel, rel_table, tau if tau is not None else q, out,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        req_to_token.stride(0), rel.stride(0), rel.stride(1), rel_table.stride(0), out.stride(0),
        scaling, extent, window if window is not None else 0,
        G=groups, BLOCK_G=block_g, D=dim, BLOCK_D=next_pow2(dim), R=d_rel,
        BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_TAU=tau is not None, HAS_WINDOW=window is not None, UPCAST=upcast, PREC=prec,
        num_warps=8 if block_m * block_g >= 128 else 4, num_stages=1 if wide else 2,
    )  # fmt: skip
    return out


def extend_attention_ref(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    rel: torch.Tensor,
    rel_table: torch.Tensor,
    tau: torch.Tensor | None,
    scaling: float,
    window: int | None,
) -> torch.Tensor:
    """Same contract as `extend_attention` (without the launch knobs), in torch."""
    return paged_attention_ref(
        q, k_buf, v_buf, req_to_token, req_pool_indices, prefix_lens, extend_lens, rel, rel_table, tau,
        scaling, window,
    )  # fmt: skip
