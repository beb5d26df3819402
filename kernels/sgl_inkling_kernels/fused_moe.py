"""Fused MoE for Inkling's SwiGLU experts (routed and shared), as a grouped GEMM over expert blocks.

The (token, slot) pairs are sorted by expert and padded to BLOCK_M rows per expert; each program
multiplies one block of rows by one expert's weights, so an expert nobody selected is never read
(at batch 1 exactly the six chosen experts stream, once each). Two launches: gate/up with SwiGLU
(w13 rows interleaved: 2i gate, 2i+1 up) into an activation buffer, then the down projection,
scaled by the routing weight, into a per-pair fp32 buffer summed per token. The sort runs on the
device and every shape depends only on (tokens, top_k, experts), so there is no host sync and the
call can be captured in a CUDA graph. Shared ("sink") experts use the same kernels with every
token routed to all of them, weighted by their sink gammas.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from sgl_inkling_kernels._triton import dot_mode, interpreting, mm, require_triton, tl, triton


# Token counts are runtime values, never specialised on: Triton would otherwise compile a variant
# per divisibility class of num_pairs (a multiple of 16 or not), so the first prefill of another kind
# of length (e.g. a cached prompt's short extension after 8K-token cold prefills) paid a compile.
@triton.jit(do_not_specialize=["num_pairs"])
def _moe_up_kernel(
    X, W13, Pairs, BlockExpert, Act,
    stride_xt, stride_we, stride_wn, stride_ap, H, N_INTER, num_pairs,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(BlockExpert + pid_m)
    if e < 0:  # beyond the last real block (the grid is sized for the worst case)
        return
    pair = tl.load(Pairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    tok = pair // TOPK
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N_INTER
    offs_k = tl.arange(0, BLOCK_K)
    x_ptr = X + tok[:, None] * stride_xt + offs_k[None, :]
    g_ptr = W13 + e * stride_we + (2 * offs_n)[None, :] * stride_wn + offs_k[:, None]  # [K, N] view
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k_ok = offs_k < H - k0
        a = tl.load(x_ptr, mask=valid[:, None] & k_ok[None, :], other=0.0)
        wg = tl.load(g_ptr, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        wu = tl.load(g_ptr + stride_wn, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc_g += mm(a, wg, UPCAST, PREC)
        acc_u += mm(a, wu, UPCAST, PREC)
        x_ptr += BLOCK_K
        g_ptr += BLOCK_K
    act = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(gate) * up
    tl.store(Act + pair[:, None] * stride_ap + offs_n[None, :], act.to(Act.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])  # fmt: skip


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_down_kernel(
    Act, W2, Pairs, BlockExpert, Weights, Out,
    stride_ap, stride_we, stride_wn, stride_ot, stride_os, H, N_INTER, num_pairs,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(BlockExpert + pid_m)
    if e < 0:
        return
    pair = tl.load(Pairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < H
    offs_k = tl.arange(0, BLOCK_K)
    a_ptr = Act + pair[:, None] * stride_ap + offs_k[None, :]
    w_ptr = W2 + e * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]  # [K, N] view of [H, I]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, N_INTER, BLOCK_K):
        k_ok = offs_k < N_INTER - k0
        a = tl.load(a_ptr, mask=valid[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc += mm(a, w, UPCAST, PREC)
        a_ptr += BLOCK_K
        w_ptr += BLOCK_K
    gate = tl.load(Weights + pair, mask=valid, other=0.0).to(tl.float32)
    out_ptr = Out + (pair // TOPK)[:, None] * stride_ot + (pair % TOPK)[:, None] * stride_os + offs_n[None, :]
    tl.store(out_ptr, acc * gate[:, None], mask=valid[:, None] & n_ok[None, :])


# Up to this many (token, slot) pairs one Triton program aligns them (a [P, P] comparison). Not 128:
# on the H200 (bb4af7a, bench_decode_ops router_align) that program took about 42 us at every batch,
# against about 3.6 at P = 64 and about 55 for the torch sort at 16 tokens.
SMALL_ALIGN_PAIRS = 64


@triton.jit
def _fill_padding(Pairs, BlockExpert, num_pairs, max_blocks, block_m, offs):
    """moe_align's empty layout, in chunks of offs' length: every pair slot num_pairs (padding) and every
    block -1; a barrier after it, so that the caller's stores of real pairs land on top."""
    for b0 in range(0, max_blocks * block_m, offs.shape[0]):
        o = b0 + offs
        tl.store(Pairs + o, num_pairs + 0 * o, mask=o < max_blocks * block_m)
    for b0 in range(0, max_blocks, offs.shape[0]):
        o = b0 + offs
        tl.store(BlockExpert + o, -1 + 0 * o, mask=o < max_blocks)
    tl.debug_barrier()


@triton.jit
def align_small(
    Ids, Pairs, BlockExpert, num_pairs, num_experts, max_blocks, BLOCK_M: tl.constexpr, P: tl.constexpr
):
    """moe_align for few pairs in one program: every quantity is a count over a [P, P] comparison
    (rank among the same expert, pairs and blocks of smaller experts), so no sort and no scan."""
    i = tl.arange(0, P)
    ok = i < num_pairs
    e = tl.load(Ids + i, mask=ok, other=num_experts)  # absent and foreign pairs: id num_experts
    real = ok & (e < num_experts)
    ei, ej = e[:, None], e[None, :]
    rj = real[None, :]
    same = (ei == ej) & rj
    rank = tl.sum((same & (i[None, :] < i[:, None])).to(tl.int32), 1)
    count = tl.sum(same.to(tl.int32), 1)
    nblk = (count + BLOCK_M - 1) // BLOCK_M
    first = real & (rank == 0)
    start = tl.sum(tl.where(first[None, :] & (ej < ei), nblk[None, :], 0), 1)  # blocks of smaller experts
    # Padding everywhere first, then the real pairs and their blocks' experts.
    _fill_padding(Pairs, BlockExpert, num_pairs, max_blocks, BLOCK_M, i)
    tl.store(Pairs + start * BLOCK_M + rank, i, mask=real)
    for j in range(0, tl.max(nblk, 0)):  # block j of each expert, stored from the expert's first pair
        tl.store(BlockExpert + start + j, e, mask=first & (j < nblk))


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _moe_align_small_kernel(
    Ids, Pairs, BlockExpert, num_pairs, num_experts, max_blocks, BLOCK_M: tl.constexpr, P: tl.constexpr
):
    align_small(Ids, Pairs, BlockExpert, num_pairs, num_experts, max_blocks, BLOCK_M, P)


# Past SMALL_ALIGN_PAIRS and up to this many pairs (decode batches of 11 to 85 tokens at top-6) one
# Triton program sorts them (_moe_align_sort_kernel) instead of a dozen torch launches, about 60 us a
# layer at 64 tokens on the H200 (bb4af7a), 27 of them the radix sort. Router + align timed eagerly on
# the H100 (switches_62faac1): 67 us against 141 at 64 tokens, 21 against 61 at 11.
SORT_ALIGN_PAIRS = 512


@triton.jit
def _hypercube_bit(N_DIMS: tl.constexpr, AXIS: tl.constexpr):
    """Each element's coordinate (0 or 1) along AXIS, counted from the innermost, of a [2] * N_DIMS cube."""
    return tl.reshape(tl.arange(0, 2), [1] * (N_DIMS - AXIS - 1) + [2] + [1] * AXIS)


@triton.jit
def _compare_and_swap(h, down, N_DIMS: tl.constexpr, AXIS: tl.constexpr):
    """One step of the bitonic network on a [2] * N_DIMS cube of keys: each pair along AXIS (from the
    innermost) in order, descending where `down`. The partner is the pair's sum less the key itself."""
    partner = tl.sum(h, N_DIMS - 1 - AXIS, keep_dims=True) - h
    return tl.where((h > partner) != (down ^ _hypercube_bit(N_DIMS, AXIS)).to(tl.int1), partner, h)


@triton.jit
def _sort_keys(keys, LOG_P: tl.constexpr):
    """The 2**LOG_P int32 keys (distinct, non-negative, below 2**30) in ascending order: tl.sort's
    bitonic network, partners found by a sum where tl.sort reduces with xor. A sum is as cheap on the
    GPU, and the interpreter runs it natively where its xor reduction took about a second a call."""
    h = tl.reshape(keys, [2] * LOG_P)
    for stage in tl.static_range(1, LOG_P + 1):
        if stage < LOG_P:
            down = _hypercube_bit(LOG_P, stage)  # alternate runs of 2**stage keys sort descending
        else:
            down = 0
        for k in tl.static_range(stage):
            h = _compare_and_swap(h, down, LOG_P, stage - 1 - k)
    return tl.reshape(h, [2**LOG_P])


@triton.jit
def _run_tail(e_a, n_a, e_b, n_b):
    """Scan combine over expert ids in sorted order: (the expert of a segment's last pair, the length of
    its run within the segment). The ids being sorted, segment b ending on a's last expert is that
    expert throughout, so its run continues a's."""
    return e_b, tl.where(e_a == e_b, n_a + n_b, n_b)


@triton.jit(do_not_specialize=["num_pairs", "num_experts", "max_blocks", "block_m"])
def _moe_align_sort_kernel(
    Ids, Pairs, BlockExpert, num_pairs, num_experts, max_blocks, block_m, LOG_P: tl.constexpr
):
    """moe_align in one program for at most P = 2**LOG_P pairs, as the torch path lays them out (id
    num_experts, foreign, in a last run whose blocks are -1). Sorting the keys expert * P + pair gives
    the stable argsort's order; a scan each way over the sorted experts gives each pair its rank in its
    expert's run and the run's length, so the padding before it is a cumsum over the runs' last pairs.
    Nothing is looked up per expert: no scratch buffer, no gather, no [P, P] tile.
    Every int argument is a runtime value: one compiled variant serves every batch, expert count and
    block size."""
    P: tl.constexpr = 2**LOG_P
    j = tl.arange(0, P)
    real = j < num_pairs
    e = tl.load(Ids + j, mask=real, other=num_experts + 1).to(tl.int32)  # absent pairs: a run after all
    key = _sort_keys(e * P + j, LOG_P)
    e = key >> LOG_P
    ones = tl.full([P], 1, tl.int32)
    _, head = tl.associative_scan((e, ones), 0, _run_tail)  # rank in the expert's run, + 1
    _, tail = tl.associative_scan((e, ones), 0, _run_tail, reverse=True)  # pairs from here to the run's end
    count = head + tail - 1
    pad = tl.where(tail == 1, (count + block_m - 1) // block_m * block_m - count, 0)  # at a run's last pair
    dest = j + tl.cumsum(pad, 0) - pad  # sorted position + the padding of earlier runs
    _fill_padding(Pairs, BlockExpert, num_pairs, max_blocks, block_m, j)  # padding everywhere first
    tl.store(Pairs + dest, key & (P - 1), mask=real)
    # Every block of a run holds at least one of its pairs, so the pairs name all the blocks' experts.
    tl.store(BlockExpert + dest // block_m, tl.where(e < num_experts, e, -1), mask=real)


class Alignment(NamedTuple):
    """moe_align(ids, E, block_m)'s (pairs, block_expert) for a batch's ids, made ahead of the experts
    (router.route_aligned, in the routing launch); block_m says which block size it was made for."""

    pairs: torch.Tensor
    block_expert: torch.Tensor
    block_m: int


def chunk_cap(max_tokens: int) -> int:
    """The longest chunk over_token_chunks makes: max_tokens and an eighth, so that a batch a little
    past a multiple of max_tokens is split evenly rather than leaving a short last chunk."""
    return max_tokens + max_tokens // 8


CHUNK_ALIGN = 16  # rows: chunk boundaries on a multiple keep every per-token view 16-byte aligned


def token_chunks(t: int, max_tokens: int) -> list[tuple[int, int]]:
    """[a, b) row ranges covering t rows in as few chunks of at most chunk_cap(max_tokens) as can be
    (one more where t is within CHUNK_ALIGN rows a chunk of that), of about equal lengths. A mixed
    step (an 8K-token prefill chunk and 32 decode riders) cut at 4096 left the riders a chunk of
    their own, which streamed every expert they hit again through the decode kernels: 5 ms of a
    318 ms step on the H200 at 065fcad. Where the cap allows, every boundary
    is a multiple of CHUNK_ALIGN rows (the remainder goes to the last chunk): Triton keys a kernel on
    each pointer's 16-byte alignment, and a chunk starting on an odd row gave the routing weights'
    views ([T, k] and [T, S] fp32) a variant warm-up never compiled (bench_one_batch's 64 x 1,024-token
    prefill on the H200 at bb4af7a)."""
    cap = chunk_cap(max_tokens)
    n = max(1, -(-t // cap))
    unit = CHUNK_ALIGN if cap >= 4 * CHUNK_ALIGN else 1  # tiny caps (tests): rows as they come
    while True:
        base, extra = divmod(t // unit, n)
        bounds = [0]
        for i in range(n):
            bounds.append(bounds[-1] + (base + (i < extra)) * unit)
        bounds[-1] = t  # the rows past the last whole unit
        if all(b - a <= cap for a, b in zip(bounds, bounds[1:])):
            return list(zip(bounds[:-1], bounds[1:]))
        n += 1


def over_token_chunks(x, ids, weights, shared_weights, max_tokens: int, run) -> torch.Tensor:
    """A fused MoE over a long prefill in token_chunks (its per-pair fp32 buffer is [tokens, k + S, H]):
    out[a:b] = run(x[a:b], ids[a:b], weights[a:b], shared_weights[a:b] or None)."""
    out = torch.empty_like(x)
    for a, b in token_chunks(x.shape[0], max_tokens):
        sw = shared_weights[a:b] if shared_weights is not None else None
        out[a:b] = run(x[a:b], ids[a:b], weights[a:b], sw)
    return out


def default_block_m(n_pairs: int, n_exp: int) -> int:
    """Pairs per row block of the MMA kernels: 16 until experts average 4 pairs, then 64 on the GPU.
    The interpreter takes 32 there rather than staying at 16, so CPU tests see the switch (a second
    compiled variant that warm-up must reach)."""
    if n_pairs < 4 * n_exp:
        return 16
    return 32 if interpreting() else 64


def align_blocks(n_pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks of moe_align's layout: cdiv(P, block_m) + min(E + 1, P) bounds sum_e cdiv(count_e, block_m)."""
    return -(-n_pairs // block_m) + min(num_experts + 1, n_pairs)


def moe_align(
    ids: torch.Tensor, num_experts: int, block_m: int, given: Alignment | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort (token, slot) pairs by expert, each expert's run padded to a multiple of block_m.

    Returns (pairs [max_blocks * block_m]: flat pair index or num_pairs for padding,
    block_expert [max_blocks]: the expert of each block or -1 past the end; max_blocks: align_blocks).
    Device ops only: on the GPU one Triton program up to SORT_ALIGN_PAIRS pairs (one_program_align).
    Id E (an expert held by another rank under expert parallelism) is sorted into a last run whose
    blocks are -1, never computed. `given`: this layout made ahead for these ids (the router's), taken
    when it was made for this block_m.
    """
    if given is not None and given.block_m == block_m:
        return given.pairs, given.block_expert
    flat = ids.reshape(-1)
    n_pairs = flat.numel()
    max_blocks = align_blocks(n_pairs, num_experts, block_m)
    program = one_program_align(n_pairs, num_experts) if ids.is_cuda else None
    if program is not None:
        # Decode batches: one launch instead of a dozen tiny torch kernels (sort, scans, scatters),
        # which cost more than the experts' own math at batch 1 and about 60 us a layer at batch 64.
        return program(flat, num_experts, block_m, max_blocks)
    return _moe_align_torch(flat, num_experts, block_m, max_blocks)


def _moe_align_torch(
    flat: torch.Tensor, num_experts: int, block_m: int, max_blocks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_align in torch launches: for any number of pairs, on any device."""
    n_pairs = flat.numel()
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    blocks = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(blocks, 0)
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    rank = torch.arange(n_pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    dest = (block_end - blocks)[sorted_e] * block_m + rank
    pairs = torch.full((max_blocks * block_m,), n_pairs, dtype=torch.int64, device=flat.device)
    pairs[dest] = order
    block_expert = torch.searchsorted(block_end, torch.arange(max_blocks, device=flat.device), right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return pairs, block_expert


def one_program_align(n_pairs: int, num_experts: int):
    """The one-program alignment moe_align takes on the GPU for n_pairs pairs over num_experts experts:
    moe_align_small up to SMALL_ALIGN_PAIRS pairs, moe_align_sorted up to SORT_ALIGN_PAIRS (while its int32
    sort keys hold every expert id), else None (the torch launches)."""
    if n_pairs <= 0:
        return None
    if n_pairs <= SMALL_ALIGN_PAIRS:
        return moe_align_small
    if n_pairs <= SORT_ALIGN_PAIRS and sort_keys_fit(num_experts):
        return moe_align_sorted
    return None


def sort_keys_fit(num_experts: int) -> bool:
    """Whether _moe_align_sort_kernel's keys (expert * SORT_ALIGN_PAIRS + pair, int32) hold ids up to
    num_experts + 1 (foreign and absent pairs): about two million experts."""
    return (num_experts + 2) * SORT_ALIGN_PAIRS <= 2**30


def moe_align_small(
    flat: torch.Tensor, num_experts: int, block_m: int, max_blocks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_align's layout from one Triton program, for at most SMALL_ALIGN_PAIRS pairs (the blocks of
    foreign ids are left out rather than put last: neither is ever computed)."""
    n_pairs = flat.numel()
    if n_pairs > SMALL_ALIGN_PAIRS:
        raise ValueError(f"moe_align_small takes at most {SMALL_ALIGN_PAIRS} pairs, got {n_pairs}")
    pairs = torch.empty(max_blocks * block_m, dtype=torch.int64, device=flat.device)
    block_expert = torch.empty(max_blocks, dtype=torch.int64, device=flat.device)
    # Shapes are constexpr-free except BLOCK_M, so serving compiles this once per block size.
    _moe_align_small_kernel[(1,)](
        flat.contiguous(), pairs, block_expert, n_pairs, num_experts, max_blocks, BLOCK_M=block_m, P=SMALL_ALIGN_PAIRS
    )  # fmt: skip
    return pairs, block_expert


def moe_align_sorted(
    flat: torch.Tensor, num_experts: int, block_m: int, max_blocks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_align's layout, exactly as its torch launches make it (foreign ids' run included), from one
    Triton program (_moe_align_sort_kernel), for at most SORT_ALIGN_PAIRS pairs."""
    n_pairs = flat.numel()
    if n_pairs > SORT_ALIGN_PAIRS or not sort_keys_fit(num_experts):
        raise ValueError(
            f"moe_align_sorted takes at most {SORT_ALIGN_PAIRS} pairs and ids that fit its int32 keys, got "
            f"{n_pairs} pairs over {num_experts} experts"
        )
    pairs = torch.empty(max_blocks * block_m, dtype=torch.int64, device=flat.device)
    block_expert = torch.empty(max_blocks, dtype=torch.int64, device=flat.device)
    _moe_align_sort_kernel[(1,)](
        flat.contiguous(), pairs, block_expert, n_pairs, num_experts, max_blocks, block_m,
        LOG_P=SORT_ALIGN_PAIRS.bit_length() - 1,
    )  # fmt: skip
    return pairs, block_expert


def _experts_into(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    out: torch.Tensor,  # [T, top_k, H] fp32 view: slot s of token t gets weight * expert(x_t)
    block_m: int | None,
    alignment: Alignment | None = None,
) -> None:
    t, top_k = ids.shape
    n_exp, two_i, h = w13.shape
    inter = two_i // 2
    n_pairs = t * top_k
    if block_m is None:
        block_m = default_block_m(n_pairs, n_exp)
    pairs, block_expert = moe_align(ids, n_exp, block_m, alignment)
    act = torch.empty(n_pairs, inter, dtype=x.dtype, device=x.device)
    upcast, prec = dot_mode(x.dtype)
    bn, bk = (16, 16) if interpreting() else (64, 128)
    blocks = block_expert.shape[0]
    _moe_up_kernel[(blocks, triton.cdiv(inter, bn))](
        x, w13, pairs, block_expert, act, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0), h, inter,
        n_pairs, TOPK=top_k, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, UPCAST=upcast, PREC=prec,
        num_warps=4, num_stages=3,
    )  # fmt: skip
    _moe_down_kernel[(blocks, triton.cdiv(h, bn))](
        act, w2, pairs, block_expert, weights, out, act.stride(0), w2.stride(0), w2.stride(1),
        out.stride(0), out.stride(1), h, inter, n_pairs,
        TOPK=top_k, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, UPCAST=upcast, PREC=prec,
        num_warps=4, num_stages=3,
    )  # fmt: skip


def _check(w13: torch.Tensor, w2: torch.Tensor) -> None:
    require_triton()
    if w13.stride(-1) != 1 or w2.stride(-1) != 1 or w13.shape[0] != w2.shape[0]:
        raise ValueError("fused_moe: expert weights must be [E, 2I, H] and [E, H, I] with contiguous rows")


def fused_moe(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2I, H] gate/up rows interleaved
    w2: torch.Tensor,  # [E, H, I]
    ids: torch.Tensor,  # [T, k] int64 routed expert ids
    weights: torch.Tensor,  # [T, k] routing weights
    shared_w13: torch.Tensor | None = None,  # [S, 2I, H]
    shared_w2: torch.Tensor | None = None,  # [S, H, I]
    shared_weights: torch.Tensor | None = None,  # [T, S] sink gammas
    block_m: int | None = None,
    max_tokens: int = 4096,
    foreign_ids: bool = False,  # ids may be E (experts on other ranks): their pairs contribute zero
    alignment: Alignment | None = None,  # the router's moe_align of ids, used if for this block_m
) -> torch.Tensor:
    """sum_k w_k E_k(x) (+ sum_s gamma_s Shared_s(x)), summed in fp32, returned in x's dtype.

    Long prefills go through in chunks of about `max_tokens` (token_chunks): the per-pair fp32 buffer is
    [tokens, k + S, H], 13 GB for 64K tokens at Inkling's width if taken whole.
    """
    _check(w13, w2)
    x = x if x.stride(-1) == 1 else x.contiguous()
    t, k = ids.shape
    if t > chunk_cap(max_tokens):
        return over_token_chunks(x, ids, weights, shared_weights, max_tokens, lambda xc, ic, wc, sc: fused_moe(
            xc, w13, w2, ic, wc, shared_w13, shared_w2, sc, block_m, max_tokens, foreign_ids))  # fmt: skip
    n_shared = shared_w13.shape[0] if shared_w13 is not None else 0
    alloc = torch.zeros if foreign_ids else torch.empty  # foreign pairs are never written
    out = alloc(t, k + n_shared, x.shape[1], dtype=torch.float32, device=x.device)
    if t == 0:
        return torch.zeros_like(x)
    _experts_into(x, w13, w2, ids.contiguous(), weights.contiguous(), out[:, :k], block_m, alignment)
    if n_shared:
        _check(shared_w13, shared_w2)
        shared_ids = torch.arange(n_shared, device=x.device).expand(t, n_shared).contiguous()
        _experts_into(x, shared_w13, shared_w2, shared_ids, shared_weights.contiguous(), out[:, k:], block_m)
    return out.sum(1).to(x.dtype)


def fused_moe_ref(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    shared_w13: torch.Tensor | None = None,
    shared_w2: torch.Tensor | None = None,
    shared_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The model's RoutedExperts + SharedExperts math, pair by pair in fp32."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)

    def expert(rows: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        gu = F.linear(rows.float(), a.float()).unflatten(-1, (-1, 2))
        return F.linear(F.silu(gu[..., 0]) * gu[..., 1], b.float())

    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        out.index_add_(0, tok, expert(x[tok], w13[e], w2[e]) * weights[tok, slot, None].float())
    if shared_w13 is not None:
        for s in range(shared_w13.shape[0]):
            out += expert(x, shared_w13[s], shared_w2[s]) * shared_weights[:, s, None].float()
    return out.to(x.dtype)
