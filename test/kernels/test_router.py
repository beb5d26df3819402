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
