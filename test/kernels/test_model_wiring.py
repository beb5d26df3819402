"""The kernels fed with the inkling-tiny model's own modules and tensors give what those modules
give: the checks behind the model wiring (RMSNorm, the residual-add + norm between the blocks,
ShortConv, Router, MoE, the packed q/k/v/r projection, the output conv + add + norm). fp32, Triton's interpreter on CPU."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling.mem_cache.memory_pool import SCONV_ATTN, SCONV_MLP, SConvStatePool  # noqa: E402
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from sgl_inkling.models.inkling.moe import MoE  # noqa: E402
from sgl_inkling_kernels._triton import kernel_dispatch  # noqa: E402
from sgl_inkling_kernels.fused_moe import fused_moe  # noqa: E402
from sgl_inkling_kernels.rmsnorm import fused_add_rmsnorm, rmsnorm  # noqa: E402
from sgl_inkling_kernels.router import route  # noqa: E402
from sgl_inkling_kernels.sconv import sconv_decode, sconv_extend  # noqa: E402
from sgl_inkling_kernels.sconv_norm import sconv_add_decode, sconv_add_rmsnorm_decode  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model(tiny_path):
    from sgl_inkling.model_executor.model_loader import load_model

    return load_model(tiny_path, torch.float32, DEVICE, progress=False)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def test_rmsnorm_and_fused_add_match_modules(model):
    layer = model.model.llm.layers[1]
    h, a = _x(9, 64, seed=1), _x(9, 64, seed=2)
    torch.testing.assert_close(rmsnorm(h, layer.attn_norm.weight, layer.attn_norm.eps), layer.attn_norm(h))
    q = _x(9, 4, 16, seed=3)  # per-head q norm over [T, heads, head_dim]
    torch.testing.assert_close(rmsnorm(q, layer.attn.q_norm.weight, layer.attn.q_norm.eps), layer.attn.q_norm(q))
    normed, summed = fused_add_rmsnorm(a, h, layer.mlp_norm.weight, layer.mlp_norm.eps)
    torch.testing.assert_close(summed, h + a, atol=0, rtol=0)
    torch.testing.assert_close(normed, layer.mlp_norm(h + a))


def test_router_and_moe_match_modules(model):
    moe = model.model.llm.layers[2].mlp
    assert isinstance(moe, MoE)
    x = _x(11, 64, seed=4)
    ids_ref, w_ref, g_ref = moe.gate(x)
    gate = moe.gate
    logits = torch.nn.functional.linear(x.float(), gate.weight.float())
    ids, w, g = route(logits, gate.bias, gate.global_scale, gate.top_k, gate.route_scale, x.dtype)
    order, order_ref = ids.argsort(-1), ids_ref.argsort(-1)
    assert torch.equal(ids.gather(-1, order), ids_ref.gather(-1, order_ref))
    torch.testing.assert_close(w.gather(-1, order), w_ref.gather(-1, order_ref))
    torch.testing.assert_close(g, g_ref)
    e, s = moe.experts, moe.shared_experts
    got = fused_moe(x, e.w13_weight, e.w2_weight, ids, w, s.shared_w13_weight, s.shared_w2_weight, g)
    torch.testing.assert_close(got, moe(x), atol=1e-4, rtol=1e-4)


def test_sconv_matches_module(model):
    conv = model.model.llm.layers[0].attn_sconv
    layer_id = conv.layer_id
    pool_ref = SConvStatePool(4, {layer_id: (32, 32, 64, 64)}, 4, DEVICE)
    pool = SConvStatePool(4, {layer_id: (32, 32, 64, 64)}, 4, DEVICE)
    rows, prefix = [2, 0], [0, 5]
    batch = ForwardBatch.build(ForwardMode.EXTEND, [[1] * 6, [2] * 3], rows, prefix, [0] * 9, [0] * 9, DEVICE)
    batch.sconv_pool = pool_ref
    for p in (pool_ref, pool):  # the second sequence resumes from a live state
        p.state(layer_id, SCONV_ATTN)[0] = _x(3, 64, seed=5)
    x = _x(9, 64, seed=6)
    want = conv(x, batch)
    state = pool.state(layer_id, SCONV_ATTN)
    got = sconv_extend(x, conv.weight, state, batch.req_pool_indices, batch.prefix_lens, batch.extend_lens)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(state, pool_ref.state(layer_id, SCONV_ATTN))
    dec = ForwardBatch.build(ForwardMode.DECODE, [[3], [4]], rows, [6, 8], [0, 0], [0, 0], DEVICE)
    dec.sconv_pool = pool_ref
    x1 = _x(2, 64, seed=7)
    torch.testing.assert_close(sconv_decode(x1, conv.weight, state, dec.req_pool_indices), conv(x1, dec))
    torch.testing.assert_close(state, pool_ref.state(layer_id, SCONV_ATTN))


def test_packed_projection_holds_the_checkpoint_weights(model, tiny_path):
    """The loader copies wq/wk/wv/wr into views of one packed tensor: the packed rows are the hub
    tensors, read here straight from the checkpoint file."""
    from safetensors import safe_open

    from sgl_inkling.models.inkling.weights import checkpoint_files

    hub = {}
    for f in checkpoint_files(tiny_path):
        with safe_open(f, framework="pt") as sf:
            hub.update({n: sf.get_tensor(n) for n in sf.keys() if ".attn.w" in n and "wo_ud" not in n})
    for i, layer in enumerate(model.model.llm.layers):
        names = [f"model.llm.layers.{i}.attn.{n}.weight" for n in ("wq_du", "wk_dv", "wv_dv", "wr_du")]
        want = torch.cat([hub[n] for n in names]).to(DEVICE, torch.float32)
        torch.testing.assert_close(layer.attn.wqkvr, want, atol=0, rtol=0)


@pytest.mark.parametrize("layer_idx", [0, 1])  # a sliding and a full layer
def test_fused_decode_projection_matches_modules(model, layer_idx):
    """Packed q/k/v/r GEMV + epilogue kernel (interpreter) vs the four projections, the two convs and
    the two norms as modules, on a decode batch: q, k, v, rel and the K/V conv states."""
    attn = model.model.llm.layers[layer_idx].attn
    lid, s = attn.spec.layer_id, attn.spec
    chans = (s.num_kv_heads * s.head_dim,) * 2 + (64, 64)
    pools = [SConvStatePool(5, {lid: chans}, 4, DEVICE) for _ in range(2)]
    for p in pools:
        for stream in range(2):
            p.state(lid, stream).copy_(_x(5, 3, chans[0], seed=10 + stream))
    batches = []
    for p in pools:
        b = ForwardBatch.build(ForwardMode.DECODE, [[3], [4], [5]], [4, 1, 2], [6, 8, 30], [0] * 3, [0] * 3, DEVICE)
        b.sconv_pool = p
        batches.append(b)
    x = _x(3, 64, seed=9)
    with kernel_dispatch(True):
        got = attn.project(x, batches[0])
    with kernel_dispatch(False):
        want = attn.project(x, batches[1])
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    # The states hold the k/v projections: the decode GEMV (dense_gemv) sums K in its own order, so
    # they agree to fp32 rounding, not bit for bit (test_qkvr_epilogue checks the state update exactly).
    for stream in range(2):
        torch.testing.assert_close(pools[0].state(lid, stream), pools[1].state(lid, stream), atol=1e-5, rtol=1e-5)


def test_output_conv_add_norm_matches_modules(model):
    """The decode kernel fed a layer's attn_sconv / mlp_norm / mlp_sconv gives what the modules give:
    conv, residual add, norm; and the conv states move the same way."""
    layer = model.model.llm.layers[2]
    lid = layer.attn.spec.layer_id
    pools = [SConvStatePool(4, {lid: (32, 32, 64, 64)}, 4, DEVICE) for _ in range(2)]
    for p in pools:
        for stream in (SCONV_ATTN, SCONV_MLP):
            p.state(lid, stream).copy_(_x(4, 3, 64, seed=20 + stream))
    dec = ForwardBatch.build(ForwardMode.DECODE, [[3], [4]], [3, 1], [6, 8], [0, 0], [0, 0], DEVICE)
    dec.sconv_pool = pools[1]
    a, h, m = _x(2, 64, seed=21), _x(2, 64, seed=22), _x(2, 64, seed=23)
    state = pools[0].state(lid, SCONV_ATTN)
    normed, summed = sconv_add_rmsnorm_decode(
        a, layer.attn_sconv.weight, state, dec.req_pool_indices, h, layer.mlp_norm.weight, layer.mlp_norm.eps
    )
    want_sum = h + layer.attn_sconv(a, dec)
    torch.testing.assert_close(summed, want_sum)
    torch.testing.assert_close(normed, layer.mlp_norm(want_sum))
    out = sconv_add_decode(m, layer.mlp_sconv.weight, pools[0].state(lid, SCONV_MLP), dec.req_pool_indices, summed)
    torch.testing.assert_close(out, want_sum + layer.mlp_sconv(m, dec))
    for stream in (SCONV_ATTN, SCONV_MLP):
        torch.testing.assert_close(pools[0].state(lid, stream), pools[1].state(lid, stream), atol=0, rtol=0)


def test_decode_router_in_kernels_matches_module(model):
    """A decode-sized MoE on the Triton path (router GEMM in the routing kernels, then fused_moe)
    equals the module's torch path; so does the routing alone."""
    from sgl_inkling_kernels.router import route_decode

    moe = model.model.llm.layers[2].mlp
    x = _x(5, 64, seed=30)
    g = moe.gate
    ids, w, gam = route_decode(x, g.weight, g.bias, g.global_scale, g.top_k, g.route_scale)
    ids_ref, w_ref, g_ref = g(x)
    order, order_ref = ids.argsort(-1), ids_ref.argsort(-1)
    assert torch.equal(ids.gather(-1, order), ids_ref.gather(-1, order_ref))
    torch.testing.assert_close(w.gather(-1, order), w_ref.gather(-1, order_ref))
    torch.testing.assert_close(gam, g_ref)
    with kernel_dispatch(True):
        got = moe(x)
    with kernel_dispatch(False):
        want = moe(x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_decode_moe_takes_the_alignment_from_the_router(model, monkeypatch):
    """A one-token MoE (BF16 experts) has the router lay out the experts' pairs (route_decode_aligned, at
    fused_moe's block size) and gives the module's result; larger batches route and align apart."""
    import sgl_inkling.models.inkling.moe as moe_mod
    from sgl_inkling_kernels.fused_moe import default_block_m

    moe = model.model.llm.layers[2].mlp
    calls = []
    real = moe_mod.route_decode_aligned
    monkeypatch.setattr(moe_mod, "route_decode_aligned", lambda *a: calls.append(a[-1]) or real(*a))
    for t in (1, 3):
        x = _x(t, 64, seed=31 + t)
        with kernel_dispatch(True):
            got = moe(x)
        with kernel_dispatch(False):
            want = moe(x)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert moe_mod.ALIGNED_ROUTER_MAX_TOKENS < 3
    assert calls == [default_block_m(moe.gate.top_k, moe.experts.num_local)]  # the one-token batch only


def test_unfused_switch_takes_the_old_kernels(model, monkeypatch):
    """profile_decode's "before": inside unfused_decode the decode projection skips the packed GEMM."""
    import sgl_inkling.models.inkling.attention as attention_mod
    from sgl_inkling_kernels._triton import unfused_decode

    calls = []
    real = attention_mod.qkvr_decode_epilogue
    monkeypatch.setattr(attention_mod, "qkvr_decode_epilogue", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    attn = model.model.llm.layers[0].attn
    kv = attn.spec.num_kv_heads * attn.spec.head_dim
    pool = SConvStatePool(5, {attn.spec.layer_id: (kv, kv, 64, 64)}, 4, DEVICE)
    batch = ForwardBatch.build(ForwardMode.DECODE, [[3]], [1], [6], [0], [0], DEVICE)
    batch.sconv_pool = pool
    with kernel_dispatch(True):
        attn.project(_x(1, 64, seed=40), batch)
        assert len(calls) == 1
        with unfused_decode():
            attn.project(_x(1, 64, seed=40), batch)
    assert len(calls) == 1


def test_short_extend_with_capture_matches_modules(model):
    """An MTP-verify-like extend (3 and 5 tokens on cached prefixes, a fresh 2-token prompt) with conv
    capture through the fused extend forms (the packed projection's epilogue, then the attention and
    FFN output convs with residual add and norm) vs the modules: outputs, the four conv states and the
    four captured windows. The KV rows go to the cache, so k and v are read back from there."""
    from sgl_inkling.layers.attention.base import AttentionBackend

    layer = model.model.llm.layers[2]
    attn, lid = layer.attn, layer.attn.spec.layer_id
    s = attn.spec
    kv = s.num_kv_heads * s.head_dim
    chans = (kv, kv, 64, 64)
    lens, prefix, rows = [3, 5, 2], [6, 9, 0], [4, 1, 2]
    t = sum(lens)
    pools, captures, batches = [], [], []
    for _ in range(2):
        p = SConvStatePool(5, {lid: chans}, 4, DEVICE)
        for stream, c in enumerate(chans):
            p.state(lid, stream).copy_(_x(5, 3, c, seed=50 + stream))
        cap = [torch.full((5, 3 + 6, c), -7.0, device=DEVICE) for c in chans]
        b = ForwardBatch.build(
            ForwardMode.EXTEND, [[3] * n for n in lens], rows, prefix, list(range(t)), list(range(t)), DEVICE
        )
        b.sconv_pool, b.sconv_capture = p, {lid: cap}
        pools.append(p)
        captures.append(cap)
        batches.append(b)
    assert batches[0].fused_form(lid) == "extend"
    k_buf, v_buf = (torch.zeros(t, s.num_kv_heads, s.head_dim, device=DEVICE) for _ in range(2))

    class Dest(AttentionBackend):  # only where the new keys and values go
        def __init__(self):
            pass

        def kv_destination(self, spec, batch):
            return k_buf, v_buf, torch.arange(t, device=DEVICE)

        def forward(self, *a):
            raise AssertionError

    x, a, h, m = _x(t, 64, seed=51), _x(t, 64, seed=52), _x(t, 64, seed=53), _x(t, 64, seed=54)
    with kernel_dispatch(True):
        q, k, v, rel = attn.project(x, batches[0], Dest().kv_destination(s, batches[0]))
        normed, summed = layer._conv_add("extend", a, layer.attn_sconv, h, layer.mlp_norm, batches[0])
        _, out = layer._conv_add("extend", m, layer.mlp_sconv, summed, None, batches[0])
    assert k is None and v is None
    with kernel_dispatch(False):
        want = attn.project(x, batches[1])
        want_sum = h + layer.attn_sconv(a, batches[1])
        want_out = want_sum + layer.mlp_sconv(m, batches[1])
    for got, ref in zip((q, k_buf, v_buf, rel), want):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(summed, want_sum, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(normed, layer.mlp_norm(want_sum), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    for stream in range(4):
        # K / V states hold the projections (the packed GEMV sums in its own order): fp32 rounding.
        tol = 1e-5 if stream < 2 else 0
        torch.testing.assert_close(pools[0].state(lid, stream), pools[1].state(lid, stream), atol=tol, rtol=tol)
        torch.testing.assert_close(captures[0][stream], captures[1][stream], atol=tol, rtol=tol)
