"""MTP's sampled acceptance inside the verify graphs (CUDA): temperature > 0 batches on
inkling-tiny-draftable are judged by the sampled rule graph (the worker's counter), the rule graph
draws fresh numbers on every replay, and for the same CUDA generator state it decides exactly as
eager sample_accept (the graph's philox seed and offset are read at replay from the default
generator, and its kernels are the eager ones)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from sgl_inkling.models.inkling.model import ModelOutput  # noqa: E402
from sgl_inkling.sampling.sampling_params import SamplingParams  # noqa: E402
from sgl_inkling.speculative.acceptance import sample_accept  # noqa: E402
from sgl_inkling.speculative.verify_graphs import VerifyGraphRunner  # noqa: E402


class StaticLogits:
    """A ModelRunner stand-in whose verify forward is a copy of a static logits buffer (capturable)."""

    def __init__(self, rows: int, vocab: int):
        self.device = torch.device("cuda")
        self.req_to_token = SimpleNamespace(pad_row=0)
        self.model = SimpleNamespace(cfg=SimpleNamespace(unpadded_vocab_size=vocab, vocab_size=vocab))
        self.logits = torch.zeros(rows, vocab, device="cuda")

    def forward_eager(self, batch) -> ModelOutput:
        n = batch.input_ids.numel()
        return ModelOutput(logits=self.logits[:n] * 1.0, hidden=torch.zeros(n, 8, device="cuda"))


def test_rule_graph_draws_fresh_and_equals_eager_sample_accept():
    from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode

    bs, r, vocab = 4, 4, 201_024
    runner = StaticLogits(bs * r, vocab)
    vg = VerifyGraphRunner(runner, r, {}, bs, sampled_max_bs=bs)
    assert (0, 1024) == vg.filter_widths and vg.sampled_buckets[-1] == bs
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(bs, r, vocab, device="cuda", generator=g) * 2
    runner.logits.copy_(logits.view(bs * r, vocab))
    ids = torch.randint(0, vocab, (bs, r), device="cuda", generator=g)
    ids[:, 1:] = logits[:, :-1].argmax(-1)
    batch = ForwardBatch.build(ForwardMode.EXTEND, ids, list(range(1, bs + 1)), [5] * bs, list(range(bs * r)),
                               list(range(bs * r)), "cuda", logits_counts=[r] * bs)  # fmt: skip
    limits = torch.full((bs,), r - 1, dtype=torch.int64, device="cuda")
    forced = torch.full((bs,), -1, dtype=torch.int64, device="cuda")
    for dicts in ([{"temperature": 1.5}] * bs, [{"temperature": 1.0, "top_k": 50}, {"temperature": 0}] * 2):
        params = [SamplingParams.from_dict(d) for d in dicts]
        sampled = vg.sampling_inputs(params, excluded=False)
        assert sampled is not None
        runs = [vg.replay(batch, limits, forced, *sampled)[1].to_host() for _ in range(4)]
        if dicts[0] == {"temperature": 1.5}:  # high entropy: a repeat of all 4 bonus tokens is ~impossible
            assert len({str(x) for x in runs}) == 4, runs
        torch.cuda.manual_seed(123)
        in_graph = vg.replay(batch, limits, forced, *sampled)[1].to_host()
        torch.cuda.manual_seed(123)
        eager = sample_accept(logits, ids, params, limits).to_host()
        assert in_graph == eager, (in_graph, eager)


def test_tiny_draftable_sampled_requests_are_judged_in_the_graph():
    import sglang as sgl
    from sgl_inkling.models.inkling.tiny_draftable import ensure_draftable_checkpoint

    # Fixed k: this is the rule graph's test, and at batch 8 on the H200 the adaptive chooser drafted
    # nothing in 24 steps (plain decode was its best; 549fe3b), so no verify step was judged at all.
    eng = sgl.Engine(model_path=str(ensure_draftable_checkpoint()), random_seed=0, dtype="float32",
                     speculative_algorithm="MTP", speculative_adaptive=False)  # fmt: skip
    try:
        g = torch.Generator().manual_seed(2)
        prompts = [torch.randint(0, 199_990, (10 + 7 * i,), generator=g).tolist() for i in range(8)]
        outs = eng.generate(input_ids=prompts, sampling_params={"temperature": 0.8, "max_new_tokens": 24,
                                                                "ignore_eos": True})  # fmt: skip
        info = eng.get_server_info()["internal_states"][0]
    finally:
        eng.shutdown()
    assert all(len(o["output_ids"]) == 24 for o in outs)
    assert info["spec_verify_cuda_graph"] and info["spec_sampled_cuda_graph_max_bs"] >= 8, info
    judged = info["spec_verify_judged"]
    assert info["spec_verify_steps"] > 0, info  # requests verified drafts (counted per request)
    assert judged["sampled_graph"] > 0 and judged["greedy_graph"] == 0, judged  # outside: radix snapshots, if any
