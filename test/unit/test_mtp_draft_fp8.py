"""--speculative-draft-model-quantization fp8: the MTP depths' input projections and dense MLPs held as
e4m3 codes with a scale per output row. The quantizer against a brute-force nearest-value search over
every e4m3 code (decoded by torch, not by the runtime); then on inkling-tiny-draftable, served with
fp8 depths beside BF16/FP32 ones: only those weights change (half their bytes or less), greedy
output is the plain greedy loop's token for token (the trunk verifies), and the depths still draft
about as well as the unquantized ones."""

from __future__ import annotations

import pytest
import torch

from sgl_inkling.layers.linear import FP8, quantize_fp8_rows
from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner
from sgl_inkling.sampling.sampling_params import SamplingParams

from .helpers import draftable_scheduler, random_prompt


def _e4m3_values() -> torch.Tensor:
    """Every finite e4m3fn value, decoded by torch from its bit pattern."""
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    return v[torch.isfinite(v)]


def test_quantizer_picks_the_nearest_code_of_each_rows_scale():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 300, generator=g) * torch.tensor([1.0, 1e-3, 30.0, 1.0, 1.0, 1.0])[:, None]
    w[3] = 0.0  # an all-zero row
    w[4, :5] = torch.tensor([1.0, -1.0, 1e-9, 0.0, -0.5])  # the row's extremes, and values under e4m3's reach
    codes, scale = quantize_fp8_rows(w.to(torch.bfloat16))
    assert codes.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (6,)
    w = w.to(torch.bfloat16).float()
    amax = w.abs().amax(1)
    want_scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    torch.testing.assert_close(scale, want_scale, rtol=0, atol=0)
    values = _e4m3_values()
    target = (w / want_scale[:, None]).double()
    nearest = values.double()[(target[..., None] - values.double()).abs().argmin(-1)]
    got = codes.float().double()
    # Equal, or a tie the cast broke the other way (round half to even).
    tie = (got - target).abs() == (nearest - target).abs()
    assert bool(((got == nearest) | tie).all())
    assert got.abs().amax(1)[torch.arange(6) != 3].eq(448.0).all()  # every row's largest reaches the top code


@pytest.fixture(scope="module")
def fp8_sched(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory, speculative_draft_model_quantization="fp8")


@pytest.fixture(scope="module")
def ref_sched(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory)


def _depth_linears(model):
    for layer in model.model.mtp.layers:
        mlp = layer.transformer_block.mlp
        yield from (layer.input_proj, mlp.w13_dn, mlp.w2_md)


def test_only_the_depths_dense_weights_are_fp8(fp8_sched, ref_sched):
    fp8, ref = fp8_sched.runner.model, ref_sched.runner.model
    quantized = {id(m.weight) for m in _depth_linears(fp8)}
    ref_params = dict(ref.named_parameters())
    fp8_bytes = ref_bytes = 0
    for name, p in fp8.named_parameters():
        if id(p) in quantized:
            assert p.dtype == FP8, name
            fp8_bytes += p.nbytes
            ref_bytes += ref_params[name].nbytes
            # The codes times their row scales are the reference weight to e4m3's precision (3 bits).
            mod = fp8.get_submodule(name.rsplit(".", 1)[0])
            deq = p.float() * mod.weight_scale[:, None]
            w = ref_params[name].float()
            assert ((deq - w).abs() <= w.abs() * 2**-4 + mod.weight_scale[:, None] * 2**-9 + 1e-12).all(), name
        else:
            assert p.dtype != FP8 and torch.equal(p, ref_params[name]), name  # the trunk, attention, norms
    assert fp8_bytes * ref_params["model.llm.embed.weight"].element_size() == ref_bytes


def _serve(s, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    reqs = []
    for i, p in enumerate(prompts):
        sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, "max_new_tokens": new_tokens})
        s.handle(TokenizedGenerateReq(rid=f"q{i}", input_ids=list(p), sampling_params=sp))
        reqs.append(s.waiting[-1])
    while any(not r.finished for r in reqs):
        s.step()
        s.outbox.clear()
    return [r.output_ids for r in reqs]


def test_fp8_drafts_keep_greedy_output_and_draft_about_as_well(fp8_sched, ref_sched):
    prompts = [random_prompt(9 + 7 * i, seed=500 + i) for i in range(4)]
    new_tokens = 40
    for s in (fp8_sched, ref_sched):
        s.spec.configure(adaptive=False)  # every depth drafts every step: all get judged
    plain = SeqRunner(ModelRunner(ref_sched.runner.model, 2, 512, 1024))
    want = [plain.greedy(p, new_tokens) for p in prompts]
    assert _serve(fp8_sched, prompts, new_tokens) == want
    assert _serve(ref_sched, prompts, new_tokens) == want
    got, ref = (s.internal_state() for s in (fp8_sched, ref_sched))
    assert ref["avg_spec_accept_length"] > 2.0  # the fixture drafts well: something to keep
    assert got["avg_spec_accept_length"] >= 0.9 * ref["avg_spec_accept_length"], (got, ref)
    for s in (fp8_sched, ref_sched):
        assert s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots
