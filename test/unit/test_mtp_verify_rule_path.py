"""Which verify steps MTPWorker judges with the verify graph's rules: with graph runners installed
(graphs=False: the same rules eagerly on the static buffers, as on CPU), plain-sampled batches take
the sampled rule in the graph; a grammar request, a penalty request or the benchmark's forced counts
keep the batch out of it; greedy batches take the greedy rule and still match plain decoding."""

from __future__ import annotations

import json

import pytest

from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner
from sgl_inkling.sampling.sampling_params import SamplingParams
from sgl_inkling.speculative.adaptive import StepCosts
from sgl_inkling.speculative.verify_graphs import VerifyGraphRunner

from .helpers import draftable_scheduler, random_prompt


@pytest.fixture(scope="module")
def sched(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory)


@pytest.fixture
def rule_graphs(sched):
    """Verify runners for every width on the static buffers (batches up to 4 sampled in them)."""
    w = sched.spec
    w.verify_graphs = {r: VerifyGraphRunner(sched.runner, r, w.trunk_capture, 8, graphs=False, sampled_max_bs=4)
                       for r in range(1, w.num_steps + 2)}  # fmt: skip
    # Drafts of 1-2 tokens (cheap on the CPU): costs under which deeper drafts never pay.
    w.configure(adaptive=True, costs=StepCosts({1: [1.0, 1.02, 1.04] + [9.0] * (w.num_steps - 2)}))
    yield w
    w.configure(adaptive=False)
    w.verify_graphs = None
    w.forced_accept = None
    sched.abort("", abort_all=True)


def at_baseline(s) -> bool:
    return s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots


def run(s, specs: list[dict], grammar_last: bool = False) -> tuple[list, dict]:
    """Serve one batch to the end; its requests and the worker's judged counts it added."""
    from sgl_inkling.constrained import native_grammar

    before = dict(s.spec.judged)
    reqs = []
    for i, extra in enumerate(specs):
        ids = random_prompt(9 + 4 * i, seed=70 + i)
        sp = SamplingParams.from_dict({"ignore_eos": True, "max_new_tokens": 8, **extra})
        grammar = native_grammar(s.tokenizer, sp, ids) if grammar_last and i == len(specs) - 1 else None
        s.handle(TokenizedGenerateReq(rid=f"p{i}{len(specs)}{sorted(extra)}", input_ids=ids, sampling_params=sp,
                                      grammar=grammar))  # fmt: skip
        reqs.append(s.waiting[-1])
    while any(not r.finished for r in reqs):
        s.step()
        s.outbox.clear()
    return reqs, {k: v - before[k] for k, v in s.spec.judged.items()}


def test_plain_sampled_batches_are_judged_in_the_graph(sched, rule_graphs):
    _, judged = run(sched, [{"temperature": 0.8}, {"temperature": 1.0, "top_k": 5}, {"temperature": 0.6, "min_p": 0.1}])
    assert judged["sampled_graph"] >= 2 and judged["outside"] == 0 and judged["greedy_graph"] == 0, judged
    assert sched.spec.stats()["spec_verify_judged"]["sampled_graph"] >= judged["sampled_graph"]
    assert at_baseline(sched)


def test_greedy_batches_take_the_greedy_rule_and_match_plain_decoding(sched, rule_graphs):
    reqs, judged = run(sched, [{"temperature": 0}, {"temperature": 0}])
    assert judged["greedy_graph"] >= 1 and judged["sampled_graph"] == judged["outside"] == 0, judged
    ref = SeqRunner(ModelRunner(sched.runner.model, 2, 256, 1024))
    for r in reqs:
        assert r.output_ids == ref.greedy(list(r.origin_input_ids), 8), r.rid


@pytest.mark.parametrize("odd", [{"frequency_penalty": 0.5}, {"seed": 5}], ids=["penalty", "seed"])
def test_penalty_or_seed_requests_keep_the_batch_outside(sched, rule_graphs, odd):
    # The odd request (one token per step: the plain sampler's) ends last: it is in every step.
    _, judged = run(sched, [{"temperature": 0.8, "max_new_tokens": 4}, {"temperature": 0.8, "max_new_tokens": 5, **odd}])
    assert judged["sampled_graph"] == 0 and judged["outside"] >= 3, judged


def test_grammar_requests_keep_the_batch_outside(sched, rule_graphs):
    from test.e2e.mtp_common import SCHEMA

    schema = {"temperature": 0.8, "json_schema": json.dumps(SCHEMA), "ignore_eos": False, "max_new_tokens": 16}
    # The free request ends first: every step has the grammar request in its batch.
    _, judged = run(sched, [{"temperature": 0.8, "max_new_tokens": 4}, schema], grammar_last=True)
    assert judged["sampled_graph"] == 0 and judged["outside"] >= 3, judged


def test_forced_counts_use_the_greedy_rule(sched, rule_graphs):
    sched.spec.forced_accept = 2.0
    _, judged = run(sched, [{"temperature": 0.8}, {"temperature": 0.8}])
    assert judged["sampled_graph"] == judged["outside"] == 0 and judged["greedy_graph"] >= 2, judged
