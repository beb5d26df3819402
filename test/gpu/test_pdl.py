"""Programmatic dependent launches (Hopper): the decode-path kernels launch as dependents of the kernel
before them, so their programs are resident while it still runs; each waits (`pdl_wait`) before it
touches memory. These checks replay CUDA graphs of dependent chains many times with new inputs and
compare every replay bit for bit with the same kernels launched one after another without PDL: a
kernel that read its input before its predecessor had written it would read the last replay's
values."""

from __future__ import annotations

import pytest
import torch

from sgl_inkling_kernels._triton import no_pdl, pdl_launch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9, reason="needs a Hopper GPU"
)


def test_decode_kernels_launch_as_dependents_on_hopper():
    x = torch.zeros(1, device="cuda")
    assert pdl_launch(x) == {"PDL": True, "launch_pdl": True}
    with no_pdl():
        assert pdl_launch(x) == {"PDL": False}
    assert pdl_launch(x.cpu()) == {"PDL": False}


def _replays(chain, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(chain's outputs from graph replays with PDL, from eager launches without) for each input."""
    static = inputs[0].clone()
    chain(static)  # compile and warm up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static)
    got = []
    for x in inputs:
        static.copy_(x)
        graph.replay()
        got.append(out.clone())
    with no_pdl():
        want = [chain(x.clone()) for x in inputs]
    torch.cuda.synchronize()
    return got, want


def test_norm_chain_after_a_gemm_in_a_graph():
    # A cuBLAS GEMM (tens of us), then three RMSNorms with residuals, each reading the one before.
    from sgl_inkling_kernels.rmsnorm import fused_add_rmsnorm, rmsnorm

    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(6144, 6144, device="cuda", dtype=torch.bfloat16, generator=g) / 80
    gain = torch.rand(6144, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5

    def chain(x):
        y = x @ w
        a = rmsnorm(y, gain, 1e-6)
        b, s = fused_add_rmsnorm(a, y, gain, 1e-6)
        c, _ = fused_add_rmsnorm(b, s, gain, 1e-6)
        return c

    inputs = [torch.randn(64, 6144, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(40)]
    got, want = _replays(chain, inputs)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"replay {i}: {(a.float() - b.float()).abs().max().item()}"


def test_decode_layer_kernels_in_a_graph():
    # The decode chain of a layer's attention half: the q/k/v/r epilogue (writes k, v into the cache),
    # decode attention over 8K keys (reads them), then the conv + residual + RMSNorm launch.
    from sgl_inkling_kernels.decode_attention import decode_attention
    from sgl_inkling_kernels.qkvr_epilogue import qkvr_decode_epilogue
    from sgl_inkling_kernels.sconv_norm import sconv_add_rmsnorm_decode

    g = torch.Generator(device="cuda").manual_seed(1)
    dev, bf = "cuda", torch.bfloat16
    bsz, nh, nkv, d, r, ctx = 4, 64, 8, 128, 16, 8192

    def rnd(*shape, dtype=bf):
        return torch.randn(*shape, device=dev, dtype=dtype, generator=g)

    k_buf, v_buf = rnd(bsz * ctx, nkv, d), rnd(bsz * ctx, nkv, d)
    req_to_token = torch.arange(bsz * ctx, device=dev, dtype=torch.int32).view(bsz, ctx)
    rows = torch.arange(bsz, device=dev)
    positions = torch.tensor([ctx - 1, 5000, 777, 8000], device=dev)
    slots = req_to_token[rows, positions].long()
    norms = [torch.rand(d, device=dev, dtype=bf, generator=g) + 0.5 for _ in range(2)]
    convs = [rnd(nkv * d, 1, 4, dtype=torch.float32) / 4 for _ in range(2)]
    states = [rnd(bsz, 3, nkv * d, dtype=torch.float32) for _ in range(2)]
    table = rnd(r, 1024) / 10
    h = nh * d
    o_conv, o_state = rnd(h, 1, 4, dtype=torch.float32) / 4, rnd(bsz, 3, h, dtype=torch.float32)
    gain = torch.rand(h, device=dev, dtype=bf, generator=g) + 0.5

    def chain(x):  # x: [B, qkvr width + hidden]: the GEMM output and the residual, one tensor
        qkvr, res = x[:, : -h], x[:, -h:]
        # Conv states and the cache shift / fill in place: every run starts from the same copy.
        st = [s.clone() for s in states]
        ob = o_state.clone()
        kb, vb = k_buf.clone(), v_buf.clone()
        q, _, _, rel = qkvr_decode_epilogue(qkvr, nh, nkv, d, *norms, *convs, *st, rows, 1e-6, kv_cache=(kb, vb, slots))
        o = decode_attention(q, kb, vb, req_to_token, rows, positions, rel, table, None, 1.0 / d, None)
        normed, summed = sconv_add_rmsnorm_decode(o, o_conv, ob, rows, res, gain, 1e-6)
        return torch.cat([normed, summed, kb[slots].flatten(1), st[0].flatten(1)], 1)

    width = (nh + 2 * nkv) * d + nh * r + h
    inputs = [rnd(bsz, width) for _ in range(30)]
    got, want = _replays(chain, inputs)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"replay {i}: {(a.float() - b.float()).abs().max().item()}"


def test_dense_gemv_between_dependents_in_a_graph():
    # The decode projections' GEMV loads weight columns before its wait: a norm, the packed q/k/v/r
    # GEMV over the norm's output, a norm of the GEMV's output, the output projection's GEMV of that.
    from sgl_inkling_kernels.dense_gemv import dense_gemv
    from sgl_inkling_kernels.rmsnorm import rmsnorm

    g = torch.Generator(device="cuda").manual_seed(2)
    bf = torch.bfloat16
    w1 = torch.randn(13312, 6144, device="cuda", dtype=bf, generator=g) / 80
    w2 = torch.randn(6144, 13312, device="cuda", dtype=bf, generator=g) / 110
    g1 = torch.rand(6144, device="cuda", dtype=bf, generator=g) + 0.5
    g2 = torch.rand(13312, device="cuda", dtype=bf, generator=g) + 0.5

    def chain(x):
        y = dense_gemv(rmsnorm(x, g1, 1e-6), w1)
        return dense_gemv(rmsnorm(y, g2, 1e-6), w2)

    inputs = [torch.randn(t, 6144, device="cuda", dtype=bf, generator=g) for t in (1, 16) for _ in range(20)]
    for batch in (inputs[:20], inputs[20:]):
        got, want = _replays(chain, batch)
        for i, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), f"replay {i}: {(a.float() - b.float()).abs().max().item()}"
