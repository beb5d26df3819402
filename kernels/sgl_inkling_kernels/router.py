"""Expert-sink router: from fp32 router logits over E routed + S shared ("sink") experts to
(top-k routed ids, their weights, the shared experts' weights), one program per token.

Selection: top-k of sigmoid(l_i) + bias_i over routed experts only (the bias steers selection,
never weights). Weights: over the k chosen plus all S shared experts,
w_a = sigmoid(l_a) / sum sigmoid(l_a'), computed as a softmax of log-sigmoids (no underflow for very
negative logits), times route_scale * global_scale. The router GEMM itself stays in torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_inkling_kernels._triton import next_pow2, require_triton, tl, triton


@triton.jit
def _logsigmoid(x):
    # min(x, 0) - log(1 + exp(-|x|)), stable for any x.
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _router_kernel(
    Logits, Bias, GlobalScale, Ids, Weights, SharedWeights,
    stride_lt, route_scale,
    E: tl.constexpr, S: tl.constexpr, TOPK: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    offs_e = tl.arange(0, BLOCK_E)
    e_ok = offs_e < E
    logits = tl.load(Logits + t * stride_lt + offs_e, mask=e_ok, other=0.0)
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
    shared = _logsigmoid(tl.load(Logits + t * stride_lt + E + offs_s, mask=s_ok, other=0.0))
    shared = tl.where(s_ok, shared, float("-inf"))
    m = tl.maximum(tl.max(chosen, 0), tl.max(shared, 0))
    p_chosen = tl.exp(chosen - m)
    p_shared = tl.exp(shared - m)
    scale = route_scale * tl.load(GlobalScale).to(tl.float32) / (tl.sum(p_chosen, 0) + tl.sum(p_shared, 0))
    k_ok = offs_k < TOPK
    tl.store(Ids + t * TOPK + offs_k, ids.to(Ids.dtype.element_ty), mask=k_ok)
    tl.store(Weights + t * TOPK + offs_k, (p_chosen * scale).to(Weights.dtype.element_ty), mask=k_ok)
    tl.store(SharedWeights + t * S + offs_s, (p_shared * scale).to(SharedWeights.dtype.element_ty), mask=s_ok)


def route(
    logits: torch.Tensor,  # [T, E + S] fp32
    bias: torch.Tensor,  # [E] fp32 selection bias
    global_scale: torch.Tensor,  # [1] (a tensor, so no host sync)
    top_k: int,
    route_scale: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [T, k] int64, weights [T, k], shared weights [T, S]); weights in out_dtype."""
    require_triton()
    t, total = logits.shape
    n_routed = bias.shape[0]
    n_shared = total - n_routed
    logits = logits.float() if logits.stride(-1) == 1 else logits.float().contiguous()
    ids = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(t, top_k, dtype=out_dtype, device=logits.device)
    shared = torch.empty(t, n_shared, dtype=out_dtype, device=logits.device)
    if t == 0:
        return ids, weights, shared
    _router_kernel[(t,)](
        logits, bias.float(), global_scale, ids, weights, shared, logits.stride(0), float(route_scale),
        E=n_routed, S=n_shared, TOPK=top_k, BLOCK_E=next_pow2(n_routed), BLOCK_S=next_pow2(max(n_shared, 1)),
        BLOCK_K=next_pow2(top_k), num_warps=4,
    )  # fmt: skip
    return ids, weights, shared


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
