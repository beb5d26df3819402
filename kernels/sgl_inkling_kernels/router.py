"""Expert-sink router: from fp32 router logits over E routed + S shared ("sink") experts to
(top-k routed ids, their weights, the shared experts' weights), one program per token.

Selection: top-k of sigmoid(l_i) + bias_i over routed experts only (the bias steers selection,
never weights). Weights: over the k chosen plus all S shared experts,
w_a = sigmoid(l_a) / sum sigmoid(l_a'), computed as a softmax of log-sigmoids (no underflow for very
negative logits), times route_scale * global_scale.

Weights are returned in fp32 holding values of the activations' dtype (rounded to it, as the model's
router does): the expert kernels read fp32, so no layer converts them.

`route` takes logits from a torch GEMM (extend); `route_decode` computes them itself for a decode
step: the fp32 GEMM reads x in its own dtype (no converted copy) and splits the hidden dimension
over programs so one token still spreads its 258 x H fp32 weight reads over the SMs; the routing
program sums the splits in a fixed order (deterministic, no atomics). `route_aligned` and
`route_decode_aligned` also lay out the (token, slot) pairs for the expert kernels (moe_align) in
the same launch, for the few pairs of a small decode batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_inkling_kernels._triton import (
    interpreting,
    next_pow2,
    pdl_launch,
    pdl_wait,
    require_triton,
    tl,
    triton,
)
from sgl_inkling_kernels.fused_moe import SMALL_ALIGN_PAIRS, Alignment, align_blocks, align_small


@triton.jit
def _logsigmoid(x):
    # min(x, 0) - log(1 + exp(-|x|)), stable for any x.
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _route_token(
    Logits, Bias, GlobalScale, Ids, Weights, SharedWeights, t, stride_lt, stride_lp, route_scale,
    E: tl.constexpr, S: tl.constexpr, TOPK: tl.constexpr, PARTS: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, ROUND: tl.constexpr,
):  # fmt: skip
    """Route token t; its weights are rounded to ROUND (the activations' dtype), then stored in Weights'."""
    offs_e = tl.arange(0, BLOCK_E)
    e_ok = offs_e < E
    logits = tl.load(Logits + t * stride_lt + offs_e, mask=e_ok, other=0.0)
    for part in tl.static_range(1, PARTS):  # split-K partial sums, in order
        logits += tl.load(Logits + part * stride_lp + t * stride_lt + offs_e, mask=e_ok, other=0.0)
    score = tl.sigmoid(logits) + tl.load(Bias + offs_e, mask=e_ok, other=0.0)
    score = tl.where(e_ok, score, float("-inf"))
    offs_k = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], tl.int32)
    chosen = tl.full([BLOCK_K], float("-inf"), tl.float32)  # log-sigmoid of the chosen logits
    for i in tl.static_range(TOPK):
        best = tl.max(score, 0)
        idx = tl.min(tl.where(score == best, offs_e, BLOCK_E), 0)  # lowest index among ties
        ls = tl.sum(tl.where(offs_e == idx, _logsigmoid(logits), 0.0), 0)
        ids = tl.where(offs_k == i, idx, ids)
        chosen = tl.where(offs_k == i, ls, chosen)
        score = tl.where(offs_e == idx, float("-inf"), score)

    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < S
    shared = tl.load(Logits + t * stride_lt + E + offs_s, mask=s_ok, other=0.0)
    for part in tl.static_range(1, PARTS):
        shared += tl.load(Logits + part * stride_lp + t * stride_lt + E + offs_s, mask=s_ok, other=0.0)
    shared = _logsigmoid(shared)
    shared = tl.where(s_ok, shared, float("-inf"))
    m = tl.maximum(tl.max(chosen, 0), tl.max(shared, 0))
    p_chosen = tl.exp(chosen - m)
    p_shared = tl.exp(shared - m)
    scale = route_scale * tl.load(GlobalScale).to(tl.float32) / (tl.sum(p_chosen, 0) + tl.sum(p_shared, 0))
    k_ok = offs_k < TOPK
    tl.store(Ids + t * TOPK + offs_k, ids.to(Ids.dtype.element_ty), mask=k_ok)
    tl.store(Weights + t * TOPK + offs_k, (p_chosen * scale).to(ROUND).to(Weights.dtype.element_ty),
             mask=k_ok)  # fmt: skip
    tl.store(SharedWeights + t * S + offs_s, (p_shared * scale).to(ROUND).to(SharedWeights.dtype.element_ty),
             mask=s_ok)  # fmt: skip


@triton.jit(do_not_specialize=["stride_lp"])  # batch-dependent ints: no recompiles
def _router_kernel(
    Logits, Bias, GlobalScale, Ids, Weights, SharedWeights,
    stride_lt, stride_lp, route_scale,
    E: tl.constexpr, S: tl.constexpr, TOPK: tl.constexpr, PARTS: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, ROUND: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    _route_token(Logits, Bias, GlobalScale, Ids, Weights, SharedWeights, tl.program_id(0), stride_lt, stride_lp,
                 route_scale, E, S, TOPK, PARTS, BLOCK_E, BLOCK_S, BLOCK_K, ROUND)  # fmt: skip


@triton.jit(do_not_specialize=["T", "stride_lp", "max_blocks"])  # batch-dependent ints: no recompiles
def _route_align_kernel(
    Logits, Bias, GlobalScale, Ids, Weights, SharedWeights, Pairs, BlockExpert,
    T, stride_lt, stride_lp, route_scale, max_blocks,
    E: tl.constexpr, S: tl.constexpr, TOPK: tl.constexpr, PARTS: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr, P: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """_router_kernel for each of the T tokens, then moe_align's layout of their ids (align_small), in
    one program: a small decode batch's routing and alignment in one launch instead of two."""
    pdl_wait(PDL)
    for t in range(0, T):
        _route_token(Logits, Bias, GlobalScale, Ids, Weights, SharedWeights, t, stride_lt, stride_lp, route_scale,
                     E, S, TOPK, PARTS, BLOCK_E, BLOCK_S, BLOCK_K, ROUND)  # fmt: skip
    tl.debug_barrier()  # the ids each thread stored, visible to all before the alignment reads them
    align_small(Ids, Pairs, BlockExpert, T * TOPK, E, max_blocks, BLOCK_M, P)


def _routing_args(logits: torch.Tensor, bias: torch.Tensor, top_k: int, dtype: torch.dtype):
    """(fp32 partials [P, T, E + S], empty ids, weights and shared weights, the routing constexprs)."""
    parts = logits.reshape(-1, *logits.shape[-2:])
    _, t, total = parts.shape
    n_routed = bias.shape[0]
    n_shared = total - n_routed
    parts = parts.float() if parts.stride(-1) == 1 else parts.float().contiguous()
    ids = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    # fp32 weights holding values of `dtype`: what the model's router gives, in the dtype every expert
    # kernel reads (the CUDA decode kernel would otherwise need a converted copy a layer).
    weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    shared = torch.empty(t, n_shared, dtype=torch.float32, device=logits.device)
    rounding = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]
    meta = dict(E=n_routed, S=n_shared, TOPK=top_k, PARTS=parts.shape[0], BLOCK_E=next_pow2(n_routed),
                BLOCK_S=next_pow2(max(n_shared, 1)), BLOCK_K=next_pow2(top_k), ROUND=rounding)  # fmt: skip
    return parts, ids, weights, shared, meta


def route(
    logits: torch.Tensor,  # [T, E + S] fp32, or [P, T, E + S] split-K partial sums
    bias: torch.Tensor,  # [E] fp32 selection bias
    global_scale: torch.Tensor,  # [1] (a tensor, so no host sync)
    top_k: int,
    route_scale: float,
    dtype: torch.dtype,  # the activations': weights are rounded to it, as the model's router does
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [T, k] int64, weights [T, k], shared weights [T, S]); weights fp32, rounded to `dtype`."""
    require_triton()
    parts, ids, weights, shared, meta = _routing_args(logits, bias, top_k, dtype)
    t = ids.shape[0]
    if t == 0:
        return ids, weights, shared
    # The top-k loop is k rounds of row reductions: within one warp they are shuffles, across warps
    # each also waits on shared memory and a barrier (Inkling's 256 experts are 8 a lane).
    _router_kernel[(t,)](
        parts, bias.float(), global_scale, ids, weights, shared, parts.stride(1), parts.stride(0),
        float(route_scale), **meta, num_warps=1 if meta["BLOCK_E"] <= 256 else 4, **pdl_launch(parts),
    )  # fmt: skip
    return ids, weights, shared


def route_aligned(
    logits: torch.Tensor,
    bias: torch.Tensor,
    global_scale: torch.Tensor,
    top_k: int,
    route_scale: float,
    dtype: torch.dtype,
    block_m: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Alignment]:
    """`route`, and moe_align(ids, E, block_m) for the expert kernels, from one launch of one program,
    for at most SMALL_ALIGN_PAIRS (token, slot) pairs. One warp routes the tokens one after another
    (a warp's reductions are shuffles) and aligns the pairs over the smallest [P, P] that holds them:
    at one token (H200, 256 experts, top-6) 4.1 us against 6.4 for route and moe_align's launches; the
    serial routing loses from about two tokens on (6.8 against 6.9 at two, 10.4 against 6.9 at four)."""
    require_triton()
    parts, ids, weights, shared, meta = _routing_args(logits, bias, top_k, dtype)
    t = ids.shape[0]
    n_pairs = t * top_k
    if not 0 < n_pairs <= SMALL_ALIGN_PAIRS:
        raise ValueError(f"route_aligned: 1 to {SMALL_ALIGN_PAIRS} (token, slot) pairs, got {n_pairs}")
    blocks = align_blocks(n_pairs, meta["E"], block_m)
    pairs = torch.empty(blocks * block_m, dtype=torch.int64, device=logits.device)
    block_expert = torch.empty(blocks, dtype=torch.int64, device=logits.device)
    _route_align_kernel[(1,)](
        parts, bias.float(), global_scale, ids, weights, shared, pairs, block_expert, t, parts.stride(1),
        parts.stride(0), float(route_scale), blocks, **meta, BLOCK_M=block_m, P=next_pow2(n_pairs, 8), num_warps=1,
        **pdl_launch(parts),
    )  # fmt: skip
    return ids, weights, shared, Alignment(pairs, block_expert, block_m)


@triton.jit(do_not_specialize=["stride_op"])  # T * N: batch-dependent, no recompiles
def _router_gemv_kernel(
    X, W, Out, N, H,
    stride_xt, stride_wn, stride_op, stride_ot, chunk,
    BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Out[p, t, n] = sum over this program's share p of the hidden dim of x[t, h] * w[n, h], fp32.

    One token a program, products on the CUDA cores into a [BLOCK_N, BLOCK_H] accumulator reduced
    once at the end: no tl.dot (an IEEE fp32 dot is emulated: 22 us a call for 6 MB of weights at
    batch 1) and no 3D broadcast (a layout conversion through shared memory every step)."""
    pdl_wait(PDL)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    part = tl.program_id(1)
    t = tl.program_id(2)
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_N, BLOCK_H], tl.float32)
    h_end = tl.minimum(part * chunk + chunk, H)
    for h0 in range(part * chunk, h_end, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        h_ok = offs_h < h_end
        x = tl.load(X + t * stride_xt + offs_h, mask=h_ok, other=0.0).to(tl.float32)
        w = tl.load(W + offs_n[:, None] * stride_wn + offs_h[None, :], mask=n_ok[:, None] & h_ok[None, :], other=0.0)
        acc += w * x[None, :]
    tl.store(Out + part * stride_op + t * stride_ot + offs_n, tl.sum(acc, 1), mask=n_ok)


def router_logits_split(x: torch.Tensor, weight: torch.Tensor, parts: int | None = None) -> torch.Tensor:
    """Partial fp32 router logits [P, T, E + S] of x [T, H] (any float dtype) and weight [E + S, H]
    fp32; their sum over P is x @ weight.T. P defaults to enough hidden-dim splits to occupy the GPU.
    Each token re-reads the weights (from the L2 after the first): for a few tokens only."""
    require_triton()
    t, h = x.shape
    n = weight.shape[0]
    x = x if x.stride(-1) == 1 else x.contiguous()
    if weight.dtype != torch.float32 or weight.stride(-1) != 1:
        raise ValueError("router_logits_split: the router weight must be fp32 with contiguous rows")
    # Inkling's 258 x 6144 at one token: 33 x 12 programs of 8 rows x 512 columns (16 KB each), so
    # the 6 MB stream from every SM at once.
    block_n = 8
    block_h = 32 if interpreting() else 256
    if parts is None:
        parts = max(1, min(h // 512, 12))
    per = -(-h // parts)
    chunk = -(-per // block_h) * block_h  # a whole number of BLOCK_H per split
    parts = -(-h // chunk)
    out = torch.empty(parts, t, n, dtype=torch.float32, device=x.device)
    if t:
        _router_gemv_kernel[(triton.cdiv(n, block_n), parts, t)](
            x, weight, out, n, h, x.stride(0), weight.stride(0), out.stride(0), out.stride(1), chunk,
            BLOCK_N=block_n, BLOCK_H=block_h, num_warps=4, **pdl_launch(x),
        )  # fmt: skip
    return out


def route_decode(
    x: torch.Tensor,  # [T, H] the FFN input, in the activations' dtype
    weight: torch.Tensor,  # [E + S, H] fp32 router weight
    bias: torch.Tensor,
    global_scale: torch.Tensor,
    top_k: int,
    route_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`route` of x @ weight.T in fp32, GEMM included (two launches, no torch glue)."""
    return route(router_logits_split(x, weight), bias, global_scale, top_k, route_scale, x.dtype)


def route_decode_aligned(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    global_scale: torch.Tensor,
    top_k: int,
    route_scale: float,
    block_m: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Alignment]:
    """`route_aligned` of x @ weight.T in fp32: the GEMV and one routing launch (route_decode and
    moe_align take three)."""
    return route_aligned(
        router_logits_split(x, weight), bias, global_scale, top_k, route_scale, x.dtype, block_m
    )


def route_ref(
    logits: torch.Tensor,
    bias: torch.Tensor,
    global_scale: torch.Tensor,
    top_k: int,
    route_scale: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's Router math after its GEMM (ids in topk's order; sort to compare)."""
    n_routed = bias.shape[0]
    logits = logits.float()
    routed = logits[:, :n_routed]
    ids = torch.topk(routed.sigmoid() + bias.float(), top_k, dim=-1, sorted=False).indices
    chosen = torch.cat([routed.gather(-1, ids), logits[:, n_routed:]], dim=-1)
    weights = torch.softmax(F.logsigmoid(chosen), dim=-1) * (route_scale * global_scale.float())
    weights = weights.to(out_dtype)
    return ids, weights[:, :top_k], weights[:, top_k:]
