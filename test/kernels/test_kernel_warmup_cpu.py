"""The start-up kernel warm-up on CPU: it runs every extend and decode path on the padding row only,
leaving real requests' conv states, tables and KV untouched; and it picks one extend length per
kernel path."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling.layers.attention.triton_backend import SHORT_EXTEND  # noqa: E402
from sgl_inkling.model_executor import kernel_warmup  # noqa: E402
from sgl_inkling.model_executor.forward_batch import ForwardMode  # noqa: E402
from sgl_inkling.model_executor.kernel_warmup import extend_lengths, warm_up_kernels  # noqa: E402
from sgl_inkling.model_executor.model_runner import ModelRunner  # noqa: E402
from sgl_inkling.models.inkling.moe import FUSED_ROUTER_MAX_TOKENS  # noqa: E402
from sgl_inkling_kernels.fused_moe import SMALL_ALIGN_PAIRS, SORT_ALIGN_PAIRS  # noqa: E402


def test_extend_lengths_cover_each_path(tiny_model):
    moe = tiny_model.model.llm.layers[2].mlp
    big = -(-4 * moe.experts.num_local // moe.gate.top_k) + 1  # first length with the MoE's large blocks
    lengths = extend_lengths(tiny_model)
    assert {1, SHORT_EXTEND, SHORT_EXTEND + 1, FUSED_ROUTER_MAX_TOKENS + 1, big} <= set(lengths)


def test_cuda_extend_lengths_reach_the_sorting_alignment(tiny_model):
    # On the GPU moe_align sorts more than SMALL_ALIGN_PAIRS pairs in one program (one variant for all),
    # which tiny's top-2 reaches in no other warm-up extend (25 tokens at most: 50 pairs).
    top_k = tiny_model.model.llm.layers[2].mlp.gate.top_k
    pairs = [t * top_k for t in extend_lengths(tiny_model, torch.device("cuda"))]
    assert any(SMALL_ALIGN_PAIRS < p <= SORT_ALIGN_PAIRS for p in pairs)


def test_a_short_context_still_runs_every_token_count(tiny_model, monkeypatch):
    # The MoE's path follows the batch's token count, so an extend longer than the context (e.g. the
    # 2.7K tokens past the CUDA NVFP4 kernels with --context-length 2048) must still run, as several
    # sequences on the padding row in one batch, none past the context.
    runner = ModelRunner(tiny_model, 2, 30, 64, attention_backend="torch_native")
    seen = []
    monkeypatch.setattr(runner, "forward_eager", lambda fb: seen.append((fb.mode, fb.extend_lens_cpu)))
    warm_up_kernels(runner, 2)
    extends = [lens for mode, lens in seen if mode is ForwardMode.EXTEND]
    # each total in one batch, and the mixed batch: a long extension beside one token
    assert sorted(sum(lens) for lens in extends) == sorted([*extend_lengths(tiny_model), SHORT_EXTEND + 2])
    assert [SHORT_EXTEND + 1, 1] in extends
    assert max(n for lens in extends for n in lens) <= 28  # 1 cached + the sequence + 1 below 30
    assert any(len(lens) > 1 for lens in extends)  # lengths past 28 (the MoE's limit + 1, ...) were split
    assert kernel_warmup.split_extend(65, 30) == [28, 28, 9]


def test_warmup_touches_only_the_padding_row(tiny_model):
    # Which rows and slots a batch writes is the batch's doing, not the kernels': the torch path (fast
    # on CPU) shows it; lengths 1 and 6 under this context limit.
    runner = ModelRunner(tiny_model, 2, 8, 64)
    pad = runner.req_to_token.pad_row
    for states in runner.sconv_pool.states.values():
        for s in states:
            s.normal_()
    before = {k: [s.clone() for s in v] for k, v in runner.sconv_pool.states.items()}
    kv_before = [t[1:].clone() for t in runner.full_pool.k]
    warm_up_kernels(runner, 2)
    moved = 0
    for k, states in runner.sconv_pool.states.items():
        for s, b in zip(states, before[k]):
            torch.testing.assert_close(s[:pad], b[:pad], atol=0, rtol=0)  # real request rows
            moved += int(not torch.equal(s[pad], b[pad]))
    assert moved > 0  # the warm-up did run the convs, on the padding row
    assert not runner.req_to_token.full.any() and not runner.req_to_token.swa.any()
    for t, b in zip(runner.full_pool.k, kv_before):
        torch.testing.assert_close(t[1:], b, atol=0, rtol=0)  # only slot 0 (padding) written
