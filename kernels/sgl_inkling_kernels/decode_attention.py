"""Paged decode attention for Inkling: one query token per sequence, split over the keys.

Features: GQA (all query heads of one KV head share a program, so K/V are read once per group),
the relative bias computed in the kernel from r [heads, d_rel] and the layer's table P [d_rel, E]
(only the table columns a key block needs are read; no [T, heads, E] tensor exists), the
sliding window and log scaling (tau scales the bias; q arrives already scaled).

Grids fixed by shapes, so the kernels can be captured in a CUDA graph and never ask the host for
sequence lengths: each (sequence, KV head, split) program takes one contiguous share of the visible
keys (flash-decoding, so batch 1 still fills the GPU) and writes a normalised partial output with
its log-sum-exp; the splits are then merged. Up to MERGE_IN_KERNEL_MAX_SPLITS splits the last split
program of each (sequence, KV head) to finish merges its group's heads itself (`arrivals`: one launch,
not two); with more, a second launch merges, one program per head, in parallel.
Reference: `attention_ref.paged_attention_ref` (decode = one new token, prefix = its position).
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import (
    dot_mode,
    interpreting,
    mm,
    next_pow2,
    pdl_launch,
    pdl_wait,
    require_triton,
    tl,
    triton,
)
from sgl_inkling_kernels.arrivals import CAPACITY, arrive, counters
from sgl_inkling_kernels.attention_ref import paged_attention_ref
from sgl_inkling_kernels.paged_kv import paged_kv_block

# The in-kernel merge walks its group's splits a few at a time in one program, so it pays only for
# few splits. H200, 944145e (bench_decode_ops, one launch against two): the 512 window at batch 1
# (8 splits) 10.1 against 11.2 us, batch 64 (2-3 splits) 714.6 against 746.1 us at 8K keys and 135.9
# against 142.4 in the window; an 8K full layer at batch 1 (64 splits) 24.2 against 18.6 us.
MERGE_IN_KERNEL_MAX_SPLITS = 8


@triton.jit
def _split_range(Pos, ReqIdx, b, split, window, num_splits, HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """(t, row, start, end, used): the query's position (it attends to keys 0..t, or the window's), its
    req_to_token row, the BLOCK_N-aligned share [start, end) of the keys this split takes, and how
    many splits hold keys (trailing splits may get nothing)."""
    t = tl.load(Pos + b)
    row = tl.load(ReqIdx + b)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(t - window + 1, 0)
    hi = t + 1
    share = tl.cdiv(tl.cdiv(hi - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * share
    return t, row, start, tl.minimum(start + share, hi), tl.cdiv(hi - lo, share)


@triton.jit
def _key_block(K, V, ReqToTok, Table, row, kh, t, s0, end, extent, stride_ks, stride_kh, stride_vs, stride_vh,
               stride_rt, stride_tab, offs_d, d_ok, offs_r, r_ok, BLOCK_N: tl.constexpr):  # fmt: skip
    """Keys, values and relative-bias table columns of the block of key positions s0..s0+BLOCK_N."""
    offs_n = s0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < end
    k, v = paged_kv_block(K, V, ReqToTok, row, kh, offs_n, n_ok, offs_d, d_ok, stride_ks, stride_kh, stride_vs,
                          stride_vh, stride_rt)  # fmt: skip
    dist = t - offs_n  # the bias profile's columns at distances t - s
    cols = tl.load(Table + offs_r[:, None] * stride_tab + dist[None, :],
                   mask=r_ok[:, None] & (n_ok & (dist < extent))[None, :], other=0.0)  # fmt: skip
    return k, v, cols, n_ok


@triton.jit
def _attend_block(q, rel, k, v, cols, n_ok, m_i, l_i, acc, qk_scale, bias_scale, UPCAST: tl.constexpr,
                  PREC: tl.constexpr):  # fmt: skip
    """One block of keys into the running (max, sum, output) of the online softmax, in log2 units."""
    qk = mm(q, tl.trans(k), UPCAST, PREC)  # [BLOCK_G, BLOCK_N]
    bias = mm(rel, cols.to(rel.dtype), UPCAST, PREC)
    s = qk * qk_scale + bias * bias_scale
    s = tl.where(n_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, UPCAST, PREC)
    return m_new, l_i, acc


# The split count varies with the batch (and the GPU's SM count), so it is never specialised on, and
# the partial buffers' strides, which it would be a factor of, are not passed: both kernels index
# the contiguous [B, heads, splits, (D)] buffers from it, with D constexpr (so the partial outputs
# keep D's divisibility for vector stores) and `heads` fixed by the model.
@triton.jit(do_not_specialize=["num_splits"])
def _decode_split_kernel(
    Q, K, V, ReqToTok, ReqIdx, Pos, Rel, Table, Tau, PartO, PartLse, Counters, Out,
    stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_rt,
    stride_relb, stride_relh, stride_tab, stride_ob, heads_total,
    scaling, extent, window, num_splits,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_TAU: tl.constexpr, HAS_WINDOW: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
    MERGE: tl.constexpr, BLOCK_GM: tl.constexpr, SPLIT_CHUNK: tl.constexpr, PDL: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
):  # fmt: skip
    """PREFETCH (with PDL, decode steps only): of what this kernel reads, the previous kernel on the
    stream writes at most q, rel, tau and the key and value at position t (see `decode_attention`), so
    the split's range and its first block of keys load before `pdl_wait`, while that kernel still runs;
    after it, q, rel, tau and the key and value at t (patched into the block) load."""
    b = tl.program_id(0)
    kh = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R)
    g_ok = offs_g < G
    d_ok = offs_d < D
    r_ok = offs_r < R
    heads = kh * G + offs_g
    if PREFETCH:
        t, row, start, end, used = _split_range(Pos, ReqIdx, b, split, window, num_splits, HAS_WINDOW, BLOCK_N)
        k0, v0, cols0, n_ok0 = _key_block(K, V, ReqToTok, Table, row, kh, t, start, end, extent, stride_ks, stride_kh,
                                          stride_vs, stride_vh, stride_rt, stride_tab, offs_d, d_ok, offs_r, r_ok,
                                          BLOCK_N)  # fmt: skip
        slot_t = tl.load(ReqToTok + row * stride_rt + t)
    pdl_wait(PDL)
    if not PREFETCH:
        t, row, start, end, used = _split_range(Pos, ReqIdx, b, split, window, num_splits, HAS_WINDOW, BLOCK_N)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    rel = tl.load(Rel + b * stride_relb + heads[:, None] * stride_relh + offs_r[None, :],
                  mask=g_ok[:, None] & r_ok[None, :], other=0.0)  # fmt: skip
    # Work in log2 units (x log2(e)) so the softmax uses exp2.
    qk_scale = scaling * 1.4426950408889634
    bias_scale = 1.4426950408889634
    if HAS_TAU:
        bias_scale = tl.load(Tau + b).to(tl.float32) * 1.4426950408889634

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    first = start
    if PREFETCH:
        # The key and value at t, written by the previous kernel: patched in where the block holds t.
        k_t = tl.load(K + slot_t * stride_ks + kh * stride_kh + offs_d, mask=d_ok, other=0.0)
        v_t = tl.load(V + slot_t * stride_vs + kh * stride_vh + offs_d, mask=d_ok, other=0.0)
        fresh = (start + tl.arange(0, BLOCK_N)) == t
        k0 = tl.where(fresh[:, None], k_t[None, :], k0)
        v0 = tl.where(fresh[:, None], v_t[None, :], v0)
        if start < end:
            m_i, l_i, acc = _attend_block(q, rel, k0, v0, cols0, n_ok0, m_i, l_i, acc, qk_scale, bias_scale, UPCAST,
                                          PREC)  # fmt: skip
        first = start + BLOCK_N
    for s0 in range(first, end, BLOCK_N):
        k, v, cols, n_ok = _key_block(K, V, ReqToTok, Table, row, kh, t, s0, end, extent, stride_ks, stride_kh,
                                      stride_vs, stride_vh, stride_rt, stride_tab, offs_d, d_ok, offs_r, r_ok,
                                      BLOCK_N)  # fmt: skip
        m_i, l_i, acc = _attend_block(q, rel, k, v, cols, n_ok, m_i, l_i, acc, qk_scale, bias_scale, UPCAST, PREC)

    # An empty split reports lse = -inf and zeros; stage 2 gives it no weight.
    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    part = (b * heads_total + heads) * num_splits + split  # [BLOCK_G] rows of the partial buffers
    tl.store(PartO + part[:, None] * D + offs_d[None, :], out, mask=g_ok[:, None] & d_ok[None, :])
    tl.store(PartLse + part, lse, mask=g_ok)
    if MERGE:
        if arrive(Counters + b * tl.num_programs(1) + kh, num_splits):
            _merge_group(PartO, PartLse, Out, b, kh, heads_total, num_splits, used, stride_ob,
                         G, BLOCK_GM, D, BLOCK_D, SPLIT_CHUNK)  # fmt: skip


@triton.jit
def _merge_group(
    PartO, PartLse, Out, b, kh, heads_total, num_splits, used, stride_ob,
    G: tl.constexpr, BLOCK_GM: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
):  # fmt: skip
    """The G heads of KV head kh: the first `used` splits (the rest hold no keys) merged by their
    log-sum-exps, SPLIT_CHUNK splits a step with a running maximum. The partials come from other
    programs: loaded from L2 (.cg), never from this SM's L1."""
    offs_g = tl.arange(0, BLOCK_GM)
    offs_c = tl.arange(0, SPLIT_CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    g_ok = offs_g < G
    d_ok = offs_d < D
    first = (b * heads_total + kh * G + offs_g) * num_splits  # [BLOCK_GM] each head's split 0
    m_i = tl.full([BLOCK_GM], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_GM], tl.float32)
    acc = tl.zeros([BLOCK_GM, BLOCK_D], tl.float32)
    for c0 in range(0, used, SPLIT_CHUNK):
        s_ok = (c0 + offs_c) < used
        rows = first[:, None] + c0 + offs_c[None, :]  # [BLOCK_GM, SPLIT_CHUNK]
        ok = g_ok[:, None] & s_ok[None, :]
        lse = tl.load(PartLse + rows, mask=ok, other=float("-inf"), cache_modifier=".cg")
        parts = tl.load(PartO + rows[:, :, None] * D + offs_d[None, None, :], mask=ok[:, :, None] & d_ok[None, None, :],
                        other=0.0, cache_modifier=".cg")  # fmt: skip
        m_new = tl.maximum(m_i, tl.max(lse, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # padded heads: nothing, not NaN
        alpha = tl.exp2(m_i - m_safe)
        w = tl.exp2(lse - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(w, 1)
        acc = acc * alpha[:, None] + tl.sum(parts * w[:, :, None], 1)
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    heads = kh * G + offs_g
    tl.store(Out + b * stride_ob + heads[:, None] * D + offs_d[None, :], o.to(Out.dtype.element_ty),
             mask=g_ok[:, None] & d_ok[None, :])  # fmt: skip


@triton.jit(do_not_specialize=["num_splits"])  # see _decode_split_kernel
def _decode_merge_kernel(
    PartO, PartLse, Out, stride_ob, num_splits,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    d_ok = offs_d < D
    first = (b * tl.num_programs(1) + h) * num_splits  # the grid's second axis is the heads
    lse = tl.load(PartLse + first + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)  # finite: the split holding key t always has it
    w = tl.exp2(lse - m)
    w = w / tl.sum(w, 0)
    parts = tl.load(PartO + (first + offs_s)[:, None] * D + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                    other=0.0)  # fmt: skip
    o = tl.sum(parts * w[:, None], 0)
    tl.store(Out + b * stride_ob + h * D + offs_d, o.to(Out.dtype.element_ty), mask=d_ok)


def default_num_splits(
    batch: int, kv_heads: int, max_keys: int, block_n: int, num_sms: int = 132, coverage: int = 8
) -> int:
    """Enough splits that batch * kv_heads * splits covers the SMs `coverage` times, but never more
    splits than key blocks. Depends only on shapes, so it is fixed per CUDA-graph bucket. Coverage 8
    (from 2): a full layer at 8K keys 17.8 us against 22.5 at batch 1 on the H200, 734 against 744
    at batch 64 (bench_decode_ops --split-coverage at 411d361; 16 was no faster)."""
    want = -(-coverage * num_sms // max(1, batch * kv_heads))
    return max(1, min(want, -(-max_keys // block_n), 64))


def decode_attention(
    q: torch.Tensor,  # [B, heads, head_dim], log scaling already applied
    k_buf: torch.Tensor,  # [slots, kv_heads, head_dim] (the new token's key already stored)
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,  # [rows, max_context] int
    req_pool_indices: torch.Tensor,  # [B]
    positions: torch.Tensor,  # [B] position of each query token
    rel: torch.Tensor,  # [B, heads, d_rel]
    rel_table: torch.Tensor,  # [d_rel, extent]
    tau: torch.Tensor | None,  # [B]
    scaling: float,
    window: int | None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
    merge_in_kernel: bool | None = None,
    one_new_key: bool = False,
) -> torch.Tensor:
    """Attention output [B, heads * head_dim] in q's dtype. No host synchronisation. num_warps /
    num_stages: the split kernel's launch; merge_in_kernel: the merge by the last split program
    (True) or a second launch (False), default by the split count (benchmark sweeps and tests; serving
    takes the defaults). one_new_key: the caller's word that the kernel launched just before this one
    wrote, of what this call reads, only q, rel, tau and each sequence's key and value at its own
    position (a decode step: the q/k/v/r epilogue or the KV store came last); with programmatic
    dependent launches the keys then start loading before that kernel ends (PREFETCH; under the
    interpreter too, where nothing runs concurrently, so CPU tests cover its arithmetic)."""
    require_triton()
    bsz, heads, dim = q.shape
    kv_heads = k_buf.shape[1]
    groups = heads // kv_heads
    d_rel, extent = rel_table.shape
    if block_n is None:
        block_n = 16 if interpreting() else 64
    if num_splits is None:
        max_keys = window if window is not None else req_to_token.shape[1]
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        num_splits = default_num_splits(bsz, kv_heads, max_keys, block_n, num_sms)
    q = q.contiguous() if q.stride(-1) != 1 else q
    rel = rel.contiguous() if rel.stride(-1) != 1 else rel
    rel_table = rel_table.contiguous()
    part_o = torch.empty(bsz, heads, num_splits, dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(bsz, heads, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty(bsz, heads * dim, dtype=q.dtype, device=q.device)
    upcast, prec = dot_mode(q.dtype)
    block_d = next_pow2(dim)
    if merge_in_kernel is None:
        merge_in_kernel = num_splits <= MERGE_IN_KERNEL_MAX_SPLITS
    merge = merge_in_kernel and 0 < bsz * kv_heads <= CAPACITY  # past the counters: the merge launch
    counter = counters(q.device, bsz * kv_heads) if merge else part_lse
    pdl = pdl_launch(q)
    _decode_split_kernel[(bsz, kv_heads, num_splits)](
        q, k_buf, v_buf, req_to_token, req_pool_indices, positions, rel, rel_table,
        tau if tau is not None else q, part_o, part_lse, counter, out,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        req_to_token.stride(0), rel.stride(0), rel.stride(1), rel_table.stride(0), out.stride(0), heads,
        scaling, extent, window if window is not None else 0, num_splits,
        G=groups, BLOCK_G=next_pow2(groups, 16), D=dim, BLOCK_D=block_d, R=d_rel,
        BLOCK_R=next_pow2(d_rel, 16), BLOCK_N=block_n,
        HAS_TAU=tau is not None, HAS_WINDOW=window is not None, UPCAST=upcast, PREC=prec,
        MERGE=merge, BLOCK_GM=next_pow2(groups), SPLIT_CHUNK=4 if groups > 4 else 8,
        num_warps=num_warps, num_stages=num_stages, PREFETCH=one_new_key and (pdl["PDL"] or interpreting()), **pdl,
    )  # fmt: skip
    if merge:
        return out
    _decode_merge_kernel[(bsz, heads)](
        part_o, part_lse, out, out.stride(0), num_splits,
        D=dim, BLOCK_D=block_d, BLOCK_S=next_pow2(num_splits, 64),  # 64: one compile for every split count
        num_warps=4, **pdl,
    )  # fmt: skip
    return out


def extend_as_decode_queries(
    req_pool_indices: torch.Tensor,  # [B]
    prefix_lens: torch.Tensor,  # [B]
    extend_lens: torch.Tensor,  # [B]
    num_tokens: int,  # sum(extend_lens), known on the host
    width: int | None = None,  # every extend_lens[i], when they are all equal (known on the host)
) -> tuple[torch.Tensor, torch.Tensor]:
    """An extend batch as one decode query per new token: (row, position) of each, for
    `decode_attention`. Token j of a sequence attends to keys [0, prefix + j], exactly the extend's
    causal rule, since the backend stores the new keys in the pool first. Device ops only.

    Worth it for short extensions (MTP verify and draft steps): the extend kernel tiles a
    sequence's few queries into one program per KV head, which leaves most SMs idle while it
    walks a long prefix; decode queries split the keys across programs.

    With `width` (every sequence brings that many tokens, as MTP's verify and draft batches do) the
    same tensors come from a broadcast: 3 launches (an arange, an add, a copy of the rows) instead
    of about 10 (two scans, gathers, aranges), which a latency-bound draft step pays per depth."""
    dev = extend_lens.device
    if width is not None:
        b = req_pool_indices.shape[0]
        positions = (prefix_lens[:, None] + torch.arange(width, device=dev)).view(-1)
        # Contiguous (the kernel reads rows[b] at unit stride): a copy unless width is 1.
        return req_pool_indices[:, None].expand(b, width).contiguous().view(-1), positions
    seq = torch.repeat_interleave(torch.arange(extend_lens.shape[0], device=dev), extend_lens, output_size=num_tokens)
    first = torch.cumsum(extend_lens, 0) - extend_lens
    positions = prefix_lens[seq] + torch.arange(num_tokens, device=dev) - first[seq]
    return req_pool_indices[seq], positions


def decode_attention_ref(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    positions: torch.Tensor,
    rel: torch.Tensor,
    rel_table: torch.Tensor,
    tau: torch.Tensor | None,
    scaling: float,
    window: int | None,
) -> torch.Tensor:
    """Same contract as `decode_attention`, in torch (host loop over sequences)."""
    ones = torch.ones_like(positions)
    return paged_attention_ref(
        q, k_buf, v_buf, req_to_token, req_pool_indices, positions, ones, rel, rel_table, tau, scaling, window
    )
