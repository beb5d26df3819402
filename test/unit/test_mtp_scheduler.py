"""MTP inside the scheduler, in-process: rollback leaves exactly the state of the accepted tokens,
and rejection sampling leaves the output distribution unchanged.

Both run on inkling-tiny-draftable, where depths draft well enough that steps accept several
drafts and reject others.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.managers.scheduler import Scheduler
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner
from sgl_inkling.sampling.sampler import sampling_distribution
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo
from sgl_inkling.sampling.sampling_params import SamplingParams
from sgl_inkling.speculative.adaptive import StepCosts

from .helpers import assert_same_level_state, draftable_scheduler, random_prompt


@pytest.fixture(scope="module")
def sched(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory)


def submit(s: Scheduler, rid: str, ids: list[int], **params):
    sp = SamplingParams.from_dict({"ignore_eos": True, **params})
    s.handle(TokenizedGenerateReq(rid=rid, input_ids=list(ids), sampling_params=sp))
    return s.waiting[-1]


def step(s: Scheduler) -> None:
    s.step()
    s.outbox.clear()  # nobody reads the output socket here


@pytest.fixture(params=[False, True], ids=["ragged-chain", "fixed-shape-step"])
def draft_path(sched, request):
    """Draft with DepthChain (CPU default) or DraftStep (what CUDA graphs replay)."""
    sched.spec.fixed_shapes = request.param
    before = sched.spec.num_fixed_shape_steps
    yield request.param
    sched.spec.fixed_shapes = False
    assert (sched.spec.num_fixed_shape_steps > before) == request.param


def test_state_after_rejections_equals_fresh_prefill(sched, draft_path):
    s = sched
    s.spec.configure(adaptive=False)  # every step drafts all 8 depths: rejections at every depth
    a = submit(s, "a", random_prompt(37, seed=11), temperature=0.8, top_k=4, max_new_tokens=400)
    while len(a.output_ids) < 70:
        step(s)
    k = s.spec.num_steps
    rejected = k * a.spec_verify_ct - a.spec_accepted_drafts
    assert a.spec_accepted_drafts >= 10 and rejected >= 10, (a.spec_accepted_drafts, rejected)
    q = a.kv_len
    b = submit(s, "b", a.fill_ids[:q], temperature=0, max_new_tokens=4)
    assert s.run_prefill()  # only b's prefill (and its first drafts): a does not move
    assert b.kv_len == q and a.kv_len == q

    assert_same_level_state(s.runner, a.row, b.row, q)
    s.abort("", abort_all=True)
    assert s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots


def test_fixed_shape_drafts_equal_the_ragged_chain(sched):
    """Greedy acceptance depends on the drafts only: the same outputs, verify steps and accepted
    drafts per request mean DraftStep drafted exactly what DepthChain drafts. The batch mixes
    lengths, and requests reach max_new_tokens inside a step's accepted drafts."""
    s = sched
    prompts = [random_prompt(n, seed=40 + n) for n in (9, 23, 31, 50)]

    def run(fixed: bool) -> list[tuple]:
        # Adaptive from the same start: the same drafts give the same k every step (0..8 drafting depths).
        s.spec.configure(adaptive=True, costs=StepCosts({1: [1.0 + 0.3 * k for k in range(9)]}))
        s.spec.fixed_shapes = fixed
        reqs = [submit(s, f"g{fixed}{i}", p, temperature=0, max_new_tokens=24 + 5 * i) for i, p in enumerate(prompts)]
        while any(not r.finished for r in reqs):
            step(s)
        s.spec.fixed_shapes = False
        return [(r.output_ids, r.spec_verify_ct, r.spec_accepted_drafts) for r in reqs] + [s.spec.k_steps]

    ragged = run(False)
    before = s.spec.num_fixed_shape_steps
    fixed = run(True)
    assert s.spec.num_fixed_shape_steps > before
    assert sum(x[2] for x in ragged[:-1]) > 20, "drafts should be accepted often enough to matter"
    assert sum(1 for n in ragged[-1] if n) >= 2, ragged[-1]  # steps drafted different numbers of tokens
    assert fixed == ragged
    assert s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots


def test_grammar_requests_draft_on_the_fixed_shape_step_beside_free_ones(sched):
    """A json_schema request drafts through DraftStep with the others of the batch (its first draft
    masked there, the rest capped at their legal prefix): outputs equal the all-ragged run's (where
    the grammar picks every draft), and so do the free requests' verify steps and accepted drafts;
    the grammar's output parses, and DraftStep ran while the grammar constrained the request."""
    import json

    from sgl_inkling.constrained import native_grammar
    from test.e2e.mtp_common import SCHEMA

    s = sched
    prompts = [random_prompt(n, seed=60 + n) for n in (14, 27, 33)]
    schema = json.dumps(SCHEMA)

    def run(fixed: bool) -> list[tuple]:
        s.spec.configure(adaptive=False)
        s.spec.fixed_shapes = fixed
        reqs = [submit(s, f"gr{fixed}{i}", p, temperature=0, max_new_tokens=30) for i, p in enumerate(prompts[1:])]
        sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 80, "json_schema": schema})
        ids = prompts[0]
        s.handle(TokenizedGenerateReq(rid=f"gj{fixed}", input_ids=ids, sampling_params=sp,
                                      grammar=native_grammar(s.tokenizer, sp, ids)))  # fmt: skip
        reqs.append(s.waiting[-1])
        while any(not r.finished for r in reqs):
            was = s.spec.num_fixed_shape_steps
            step(s)
            # Drafted for the next step while the grammar still constrains it:
            fixed_while_constrained[fixed] += (s.spec.num_fixed_shape_steps - was) * (not reqs[-1].finished)
        s.spec.fixed_shapes = False
        assert reqs[-1].finished_reason["type"] == "stop", reqs[-1].finished_reason  # the grammar ended it
        obj, _ = json.JSONDecoder().raw_decode(s.tokenizer.decode(reqs[-1].output_ids))  # then the end token
        assert obj.keys() >= {"nm", "st"}
        return [(r.output_ids, r.spec_verify_ct, r.spec_accepted_drafts) for r in reqs]

    fixed_while_constrained = {False: 0, True: 0}
    ragged = run(False)
    fixed = run(True)
    assert fixed[:-1] == ragged[:-1] and fixed[-1][0] == ragged[-1][0]
    assert fixed_while_constrained == {False: 0, True: fixed_while_constrained[True]} and fixed_while_constrained[True] > 0
    assert s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots


def test_rejection_sampling_keeps_the_distribution(sched):
    """Three tokens at T=1 with top-k 3: the empirical distribution of the 27 sequences against the
    exact one computed from the trunk alone (13 forwards). The first token comes from the prefill,
    the next two from verify steps, where drafts are accepted or replaced."""
    s = sched
    prompt = random_prompt(12, seed=21)
    params = {"temperature": 1.0, "top_k": 3, "max_new_tokens": 3}

    ref = SeqRunner(ModelRunner(s.runner.model, 4, 64, 512))
    sp = SamplingParams.from_dict(params)
    info = SamplingBatchInfo.from_params([sp], s.vocab, "cpu")

    def dist(prefix: list[int]) -> torch.Tensor:
        seq = ref.new_seq()
        logits = ref.step([seq], [prefix]).logits[-1:].float()
        ref.free(seq)
        return sampling_distribution(logits, info)[0]

    exact: dict[tuple[int, ...], float] = {}
    p1 = dist(prompt)
    for t1 in p1.nonzero().flatten().tolist():
        p2 = dist(prompt + [t1])
        for t2 in p2.nonzero().flatten().tolist():
            p3 = dist(prompt + [t1, t2])
            for t3 in p3.nonzero().flatten().tolist():
                exact[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    assert len(exact) == 27 and abs(sum(exact.values()) - 1) < 1e-5

    n = 600
    # Adaptive, with costs under which 3 drafts pay at the public prior and 2 at this model's own rates
    # (about 0.3, 0.4, 0.3): the chooser moves from one to the other as its evidence comes in.
    s.spec.configure(adaptive=True, costs=StepCosts({1: [1.0, 1.05, 1.1, 1.3] + [3.0] * 5}))
    torch.manual_seed(0)  # the acceptance draws come from the global generator: a fixed sample
    reqs = [submit(s, f"chi{i}", prompt, **params) for i in range(n)]
    accepted_before = sum(r.spec_accepted_drafts for r in reqs)
    while any(not r.finished for r in reqs):
        step(s)
    accepted = sum(r.spec_accepted_drafts for r in reqs) - accepted_before
    assert accepted > n // 6, "drafts should be accepted often enough to matter"
    counts = {key: 0 for key in exact}
    for r in reqs:
        counts[tuple(r.output_ids)] += 1  # a key outside `exact` would be a token top-k forbids
    # Pool the rare sequences so every expected count is at least 5 (chi-square's validity).
    common = [key for key in exact if exact[key] * n >= 5]
    obs = [counts[key] for key in common] + [n - sum(counts[key] for key in common)]
    exp = [exact[key] * n for key in common] + [n * (1 - sum(exact[key] for key in common))]
    if exp[-1] < 5:  # into the rarest common sequence (obs[-2] += obs.pop() would add to the wrong one)
        rest_obs, rest_exp = obs.pop(), exp.pop()
        obs[-1] += rest_obs
        exp[-1] += rest_exp
    assert chisquare(obs, exp).pvalue > 1e-3, list(zip(obs, exp))
    assert list(itertools.chain(*(r.output_ids for r in reqs)))  # nothing empty
    assert sum(1 for c in s.spec.k_steps if c) >= 2, s.spec.k_steps  # steps drafted different numbers
    s.abort("", abort_all=True)


def test_mtp_buffers_are_counted_in_pool_sizing(sched):
    """size_pools sets aside what MTPWorker really allocates per request row."""
    from sgl_inkling.managers.scheduler_memory import mtp_bytes_per_request

    w = sched.spec
    buffers = [t for caps in (*w.trunk_capture.values(), *w.chain.capture.values()) for t in caps]
    allocated = sum(t.numel() * t.element_size() for t in [*buffers, w.carry, w.draft_buf, w.lag_ids, w.lag_hidden])
    assert allocated == sched.runner.sconv_pool.size * mtp_bytes_per_request(sched.runner.model, w.num_steps)


def test_step_costs_are_measured_on_diverse_tokens(sched, monkeypatch):
    """The verify steps timed at start-up see varied token ids (identical ones all route to the same
    experts, so a wide verify timed as cheap as a narrow one on the GPU), and the static inputs are
    left as captured (zeros) afterwards."""
    from sgl_inkling.speculative import step_costs
    from sgl_inkling.speculative.verify_graphs import VerifyGraphRunner

    seen, statics = [], []
    real_step = VerifyGraphRunner.step

    def step_spy(self, bs, batch=None):
        statics.append(self.static["input_ids"])
        seen.append(self.static["input_ids"][: bs * self.r].unique().numel())
        return real_step(self, bs, batch)

    monkeypatch.setattr(VerifyGraphRunner, "step", step_spy)
    costs = step_costs.measure_step_costs(sched.spec, reps=1)
    assert costs.as_dict()["by_batch_bucket"]
    widths = [s.numel() for s in statics]
    assert all(n > 1 for n, w in zip(seen, widths) if w > 1), seen  # never one token repeated
    assert all(int(s.abs().sum()) == 0 for s in statics)


def test_step_costs_scale_the_trunks_layers_alone_where_the_benchmark_measured_them(sched, monkeypatch):
    """trunk_scale with layer times (benchmarks of a cut model): a trunk forward of r tokens a request
    counts as its time plus (scale - 1) x its layers' time, so what runs once a step counts once; a
    width without a layer time falls back to scaling the step less the head."""
    from sgl_inkling.speculative import step_costs

    def one_second(fn, reps, dev):  # every timed part runs, and takes 1 s
        fn()
        return 1.0

    monkeypatch.setattr(step_costs, "_seconds", one_second)
    k_max, scale, head = sched.spec.num_steps, 22.0, 0.25
    layers = {(1, r): 0.01 * r for r in range(1, k_max + 1)}  # none for the widest verify
    costs = step_costs.measure_step_costs(sched.spec, reps=1, trunk_scale=scale, head_s=head, trunk_layers_s=layers)
    got = costs.for_batch(1)
    assert got[0] == pytest.approx(1.0 + (scale - 1) * 0.01 + 1.0 / (k_max + 1))  # plain: + the depths' catch-up share
    for k in range(1, k_max):
        assert got[k] == pytest.approx(1.0 + (scale - 1) * 0.01 * (k + 1) + 1.0 + 1.0), k  # verify, rollback, draft
    assert got[k_max] == pytest.approx((1.0 - head) * scale + head + 2.0)
