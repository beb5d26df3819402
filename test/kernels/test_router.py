"""Expert-sink router kernel vs the model's router math."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.router import route, route_ref  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# (routed experts, shared experts, top-k, tokens)
SHAPES = [(256, 2, 6, 1), (256, 2, 6, 67), (8, 2, 2, 5), (60, 3, 7, 9)] if CUDA else [(8, 2, 2, 5), (60, 3, 7, 9), (256, 2, 6, 2)]


def _sorted(ids, w):
    order = ids.argsort(dim=-1)
    return ids.gather(-1, order), w.gather(-1, order)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_router_matches_reference(shape, dtype):
    e, s, k, t = shape
    g = torch.Generator().manual_seed(e + t)
    logits = (3.0 * torch.randn(t, e + s, generator=g)).to(DEVICE)
    bias = (0.5 * torch.randn(e, generator=g)).to(DEVICE)
    gscale = torch.tensor([1.3]).to(DEVICE)
    got = route(logits, bias, gscale, k, 8.0, dtype)
    want = route_ref(logits, bias, gscale, k, 8.0, dtype)
    ids_g, w_g = _sorted(got[0], got[1])
    ids_w, w_w = _sorted(want[0], want[1])
    assert torch.equal(ids_g, ids_w)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(w_g.float(), w_w.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(got[2].float(), want[2].float(), atol=tol, rtol=tol)
    # Weights over chosen + shared sum to the route scale times the global scale.
    total = w_g.float().sum(-1) + got[2].float().sum(-1)
    torch.testing.assert_close(total, torch.full_like(total, 8.0 * 1.3), atol=tol * 10, rtol=tol)


def test_router_bias_steers_selection_only():
    """A large bias on one expert makes it chosen, but its weight still comes from its raw logit."""
    e, s, k = 16, 2, 3
    logits = torch.randn(4, e + s, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    logits[:, 5] = -4.0
    bias = torch.zeros(e, device=DEVICE)
    bias[5] = 10.0
    gscale = torch.ones(1, device=DEVICE)
    ids, w, _ = route(logits, bias, gscale, k, 1.0, torch.float32)
    assert (ids == 5).any(-1).all()
    ids_ref, w_ref, _ = route_ref(logits, bias, gscale, k, 1.0, torch.float32)
    torch.testing.assert_close(_sorted(ids, w)[1], _sorted(ids_ref, w_ref)[1], atol=1e-6, rtol=1e-5)
    # Expert 5's weight reflects its low logit (-4), not the bias that selected it.
    w5 = (w * (ids == 5)).sum(-1)
    assert (w5 < w.max(-1).values).all()


@pytest.mark.parametrize("t", [1, 3, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("parts", [None, 1, 3])
def test_route_decode_includes_the_gemm(t, dtype, parts):
    """The split-K fp32 router GEMM (x read in its own dtype) + routing vs torch's fp32 GEMM + the
    reference routing; the partial sums add up to the GEMM."""
    from sgl_inkling_kernels.router import route_decode, router_logits_split

    e, s, k, h = (256, 2, 6, 6144) if CUDA else (60, 3, 7, 1100)  # 1100: ragged splits
    g = torch.Generator().manual_seed(t + h)
    x = torch.randn(t, h, generator=g).to(DEVICE, dtype)
    w = (0.1 * torch.randn(e + s, h, generator=g)).to(DEVICE)
    bias = (0.5 * torch.randn(e, generator=g)).to(DEVICE)
    gscale = torch.tensor([1.3]).to(DEVICE)
    logits = x.float() @ w.t()
    split = router_logits_split(x, w, parts)
    assert split.shape[0] > 1 or parts == 1
    torch.testing.assert_close(split.sum(0), logits, atol=1e-4, rtol=1e-4)
    ids, wts, sh = route_decode(x, w, bias, gscale, k, 8.0) if parts is None else route(
        split, bias, gscale, k, 8.0, dtype
    )
    ids_r, wts_r, sh_r = route_ref(logits, bias, gscale, k, 8.0, dtype)
    got, want = _sorted(ids, wts), _sorted(ids_r, wts_r)
    assert torch.equal(got[0], want[0])
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got[1].float(), want[1].float(), atol=tol, rtol=tol)
    torch.testing.assert_close(sh.float(), sh_r.float(), atol=tol, rtol=tol)


def _stable_topk(logits, bias, k):
    """Top-k routed ids by score, ties to the lower index (a stable sort), in selection order."""
    score = logits[:, : bias.shape[0]].float().sigmoid() + bias.float()
    return torch.sort(-score, dim=-1, stable=True).indices[:, :k]


# (routed experts, shared experts, top-k): Inkling's routing, and few experts so that pairs share them
# and blocks of 16 hold several.
ALIGNED = [(256, 2, 6), (16, 2, 6)]


@pytest.mark.parametrize("geometry", ALIGNED, ids=["inkling", "16-experts"])
@pytest.mark.parametrize("t", [1, 3, 10])
@pytest.mark.parametrize("block_m", [8, 16])
@pytest.mark.parametrize("ties", [False, True])
def test_route_aligned_is_route_and_moe_align(geometry, t, block_m, ties):
    """Routing and alignment in one program: the routing equals route's (same kernels' math) and the
    reference's (ids by a stable sort, weights to bf16's rounding), the layout the sorting moe_align's."""
    from sgl_inkling_kernels.fused_moe import moe_align
    from sgl_inkling_kernels.router import route_aligned

    e, s, k = geometry
    g = torch.Generator().manual_seed(100 * t + block_m + ties)
    parts = torch.randn(3, t, e + s, generator=g)  # split-K partials, summed in the kernel
    bias = 0.5 * torch.randn(e, generator=g)
    if ties:  # equal scores (so equal logits: bias 0), several across the top-k boundary
        parts = torch.cat([(4 * parts.sum(0, keepdim=True)).round() / 4, torch.zeros(2, t, e + s)])
        bias = torch.zeros(e)
    parts, bias, gscale = parts.to(DEVICE), bias.to(DEVICE), torch.tensor([1.3]).to(DEVICE)
    ids, w, sh, align = route_aligned(parts, bias, gscale, k, 8.0, torch.bfloat16, block_m)

    want = route(parts, bias, gscale, k, 8.0, torch.bfloat16)
    for got_t, want_t in zip((ids, w, sh), want):
        assert torch.equal(got_t, want_t)
    logits = parts.sum(0)
    assert torch.equal(ids, _stable_topk(logits, bias, k))
    ref = route_ref(logits, bias, gscale, k, 8.0, torch.bfloat16)
    if not ties:
        assert torch.equal(ids.sort(-1).values, ref[0].sort(-1).values)
    # fp32 weights holding bf16 values: what the bf16 router gives, to its rounding
    assert w.dtype == sh.dtype == torch.float32
    assert torch.equal(w, w.bfloat16().float()) and torch.equal(sh, sh.bfloat16().float())
    # by value: tied experts (equal logits) have equal weights, whichever of them topk took
    torch.testing.assert_close(w.sort(-1).values, ref[1].float().sort(-1).values, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(sh, ref[2].float(), atol=1e-2, rtol=1e-2)

    pairs, block_expert = moe_align(ids.cpu(), e, block_m)  # the sorting version (CPU tensors)
    assert align.block_m == block_m
    assert torch.equal(align.pairs.cpu(), pairs)
    assert torch.equal(align.block_expert.cpu(), block_expert)


def test_route_decode_aligned_includes_the_gemm():
    """The router GEMV then routing + alignment: route_decode's routing, moe_align's layout."""
    from sgl_inkling_kernels.fused_moe import moe_align
    from sgl_inkling_kernels.router import route_decode, route_decode_aligned

    e, s, k, h = (256, 2, 6, 6144) if CUDA else (16, 2, 6, 1100)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, h, generator=g).to(DEVICE, torch.bfloat16)
    w = (0.1 * torch.randn(e + s, h, generator=g)).to(DEVICE)
    bias = (0.5 * torch.randn(e, generator=g)).to(DEVICE)
    gscale = torch.tensor([1.3]).to(DEVICE)
    ids, wts, sh, align = route_decode_aligned(x, w, bias, gscale, k, 8.0, 8)
    for got, want in zip((ids, wts, sh), route_decode(x, w, bias, gscale, k, 8.0)):
        assert torch.equal(got, want)
    pairs, block_expert = moe_align(ids.cpu(), e, 8)
    assert torch.equal(align.pairs.cpu(), pairs) and torch.equal(align.block_expert.cpu(), block_expert)


def test_route_aligned_refuses_more_pairs_than_one_program_aligns():
    from sgl_inkling_kernels.fused_moe import SMALL_ALIGN_PAIRS
    from sgl_inkling_kernels.router import route_aligned

    t = SMALL_ALIGN_PAIRS // 6 + 1  # t tokens x 6 pairs: past what one program aligns
    logits = torch.randn(t, 18, device=DEVICE)
    with pytest.raises(ValueError, match="pairs"):
        route_aligned(
            logits, torch.zeros(16, device=DEVICE), torch.ones(1, device=DEVICE), 6, 1.0, torch.float32, 8
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_router_weights_are_fp32_rounded_to_the_activations_dtype(dtype):
    """The expert kernels read fp32 weights: the router stores them so, holding the values the model's
    router gives in the activations' dtype."""
    g = torch.Generator().manual_seed(11)
    logits = (3.0 * torch.randn(5, 60 + 3, generator=g)).to(DEVICE)
    bias = (0.5 * torch.randn(60, generator=g)).to(DEVICE)
    ids, w, sh = route(logits, bias, torch.tensor([1.3]).to(DEVICE), 7, 8.0, dtype)
    assert w.dtype == sh.dtype == torch.float32
    assert torch.equal(w, w.to(dtype).float()) and torch.equal(sh, sh.to(dtype).float())
