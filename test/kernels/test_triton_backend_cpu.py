"""The Triton attention backend through the real inkling-tiny model, in Triton's CPU interpreter,
against the torch_native backend (fp32)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels._triton import kernel_dispatch  # noqa: E402

from .backend_scenario import run_scenario  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA variant lives in test/gpu")
def test_triton_backend_matches_torch_native_on_cpu(tiny_model):
    want, want_tokens = run_scenario(tiny_model, "torch_native")
    got, got_tokens = run_scenario(tiny_model, "triton")
    assert got_tokens == want_tokens
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-4, rtol=2e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA variant lives in test/gpu")
def test_all_kernels_match_reference_on_cpu(tiny_model):
    """Every kernel the model calls (in Triton's interpreter) plus the triton backend, vs the torch model."""
    want, want_tokens = run_scenario(tiny_model, "torch_native", decode_steps=2)
    with kernel_dispatch(True):
        got, got_tokens = run_scenario(tiny_model, "triton", decode_steps=2)
    assert got_tokens == want_tokens
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=5e-4, rtol=5e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's CPU tensors; test/gpu serves mixed steps")
@pytest.mark.parametrize("sliding", [True, False], ids=["sliding-w512", "full"])
def test_mixed_batch_at_the_real_window_and_head_counts(sliding):
    """A mixed step at Inkling's geometry (64 query heads over 16 sliding / 8 full KV heads, window 512,
    bias extent 1024; narrow heads): a cold 40-token prefill beside decode riders 530 and 700 tokens
    deep (past the window) and a 3-token extension, through the backend (the riders as decode queries,
    the prefill as a sub-batch of the extend kernel) against the brute-force reference over the
    whole batch, with every key gathered through scattered slots."""
    from sgl_inkling.layers.attention.base import AttnLayerSpec
    from sgl_inkling.layers.attention.triton_backend import SHORT_EXTEND, TritonBackend
    from sgl_inkling.mem_cache.memory_pool import KVLayout, KVPool, ReqToTokenPool
    from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
    from sgl_inkling_kernels.extend_attention import extend_attention_ref

    heads, kv, dim, d_rel, extent, window = 64, 16 if sliding else 8, 16, 16, 1024, 512 if sliding else None
    prefix, ext = [0, 530, 700, 90], [40, 1, 1, 3]
    assert max(ext) > SHORT_EXTEND >= max(ext[1:])  # both paths in one batch
    g = torch.Generator().manual_seed(7)
    n_slots = sum(p + n for p, n in zip(prefix, ext)) + 5
    full = KVPool(n_slots, [0], KVLayout(kv, dim), torch.float32, "cpu")
    pool = KVPool(n_slots, [0], KVLayout(kv, dim), torch.float32, "cpu")
    table = ReqToTokenPool(6, 1024, "cpu")
    k_buf, v_buf = (full if not sliding else pool).buffers(0)
    k_buf.copy_(torch.randn(k_buf.shape, generator=g))
    v_buf.copy_(torch.randn(v_buf.shape, generator=g))
    slots = torch.randperm(n_slots, generator=g) + 1  # scattered, never the padding slot 0
    rows, out_loc, at = [4, 1, 3, 0], [], 0
    for row, p, n in zip(rows, prefix, ext):
        seq = slots[at : at + p + n]
        at += p + n
        table.write("full", row, 0, seq)
        table.write("swa", row, 0, seq)
        out_loc += seq[p:].tolist()
    t = sum(ext)
    batch = ForwardBatch.build(ForwardMode.EXTEND, [[0] * n for n in ext], rows, prefix, out_loc, out_loc, "cpu")
    backend = TritonBackend(table, full, pool)
    backend.init_forward_metadata(batch)
    spec = AttnLayerSpec(0, sliding, heads, kv, dim, window, extent, dim**-0.5)
    q, rel = torch.randn(t, heads, dim, generator=g), torch.randn(t, heads, d_rel, generator=g)
    k_new, v_new = torch.randn(t, kv, dim, generator=g), torch.randn(t, kv, dim, generator=g)
    rel_table, tau = torch.randn(d_rel, extent, generator=g), None if sliding else 1 + torch.rand(t, generator=g)
    got = backend.forward(q, k_new, v_new, rel, rel_table, tau, spec, batch)
    assert backend._long is not None  # the mixed path ran
    want = extend_attention_ref(q, k_buf, v_buf, table.swa if sliding else table.full, batch.req_pool_indices,
                                batch.prefix_lens, batch.extend_lens, rel, rel_table, tau, spec.scaling, window)  # fmt: skip
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
