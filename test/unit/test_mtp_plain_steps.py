"""MTP steps with k = 0 are plain decode steps: the trunk alone, the depths lagging and catching up
(speculative/lagging.py). The chooser's picks are forced here so that steps switch between plain
steps, runs of plain steps longer than the lag buffers and drafting steps of every width.

References: the trunk's own greedy loop (SeqRunner, no MTP) for outputs; a cold prefill of the same
tokens for the state every level holds after the switches.
"""

from __future__ import annotations

import itertools

import pytest

from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.managers.scheduler import Scheduler
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner
from sgl_inkling.sampling.sampling_params import SamplingParams

from .helpers import assert_same_level_state, draftable_scheduler, random_prompt

# 11 zeros in a row outlast the lag buffers (K + 1 = 9 tokens): a non-drafting catch-up in between.
PICKS = [0, 0, 3, 0, 8, *[0] * 11, 1, 0, 2, 5, 0, 8, 8, 0]


@pytest.fixture(scope="module")
def sched(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory)


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory, radix=True)


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory, radix=True, max_total_tokens=180)


def submit(s: Scheduler, rid: str, ids: list[int], **params):
    sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, **params})
    s.handle(TokenizedGenerateReq(rid=rid, input_ids=list(ids), sampling_params=sp))
    return s.waiting[-1]


def step(s: Scheduler) -> None:
    s.step()
    s.outbox.clear()  # nobody reads the output socket here


def force_picks(s: Scheduler, monkeypatch, picks=PICKS) -> None:
    s.spec.configure(adaptive=True)
    it = itertools.cycle(picks)
    monkeypatch.setattr(s.spec, "choose", lambda bs: next(it))


def at_baseline(s: Scheduler) -> bool:
    return s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots


@pytest.mark.parametrize("fixed", [False, True], ids=["ragged-chain", "fixed-shape-step"])
def test_greedy_across_k_switching_equals_the_trunk(sched, monkeypatch, fixed):
    s = sched
    s.spec.fixed_shapes = fixed
    force_picks(s, monkeypatch)
    before = {k: getattr(s.spec, k) for k in ("num_plain_steps", "num_catch_ups", "num_fixed_shape_steps")}
    verify_before = s.spec.num_verify_steps
    # Lengths cross the 16-token window and the depths' minimum start; some finish in plain steps.
    prompts = [random_prompt(n, seed=70 + n) for n in (5, 19, 33, 48)]
    lens = [37, 41, 30, 52]
    reqs = [submit(s, f"p{fixed}{i}", p, max_new_tokens=n) for i, (p, n) in enumerate(zip(prompts, lens))]
    while any(not r.finished for r in reqs):
        step(s)
    s.spec.fixed_shapes = False
    ref = SeqRunner(ModelRunner(s.runner.model, 2, 256, 1024))
    for r, p, n in zip(reqs, prompts, lens):
        assert r.output_ids == ref.greedy(p, n), r.rid
    assert s.spec.num_plain_steps - before["num_plain_steps"] >= 20
    assert s.spec.num_verify_steps > verify_before
    assert s.spec.num_catch_ups - before["num_catch_ups"] >= 3
    assert (s.spec.num_fixed_shape_steps > before["num_fixed_shape_steps"]) == fixed
    assert sum(r.spec_accepted_drafts for r in reqs) > 0, "drafts made after plain steps must be accepted"
    assert at_baseline(s)


@pytest.mark.parametrize("fixed", [False, True], ids=["ragged-chain", "fixed-shape-step"])
def test_state_after_plain_steps_equals_cold_prefill(sched, monkeypatch, fixed):
    """Once drafting resumes, every level holds exactly the state of the tokens (no trace of the
    lag): compared with a second request that prefills the same tokens cold."""
    s = sched
    s.spec.fixed_shapes = fixed
    force_picks(s, monkeypatch)
    a = submit(s, "a", random_prompt(29, seed=5), max_new_tokens=400)
    lagged = False
    while len(a.output_ids) < 45 or a.depth_lag or s.spec.k == 0:
        step(s)
        lagged |= a.depth_lag > 0
    s.spec.fixed_shapes = False
    assert lagged
    q = a.kv_len
    b = submit(s, "b", a.fill_ids[:q], max_new_tokens=4)
    assert s.run_prefill()  # only b's prefill (and its first drafts): a does not move
    assert b.kv_len == q and a.kv_len == q
    assert_same_level_state(s.runner, a.row, b.row, q)
    s.abort("", abort_all=True)
    assert at_baseline(s)


def test_request_finishing_in_a_plain_step_caches_every_level(cached, sched, monkeypatch):
    """A request that ends while its depths lag is cached with the depths caught up: its
    continuation, resumed from that cache entry, holds the state of a cold prefill of the same
    tokens (in the scheduler without a cache)."""
    force_picks(cached, monkeypatch, [0])  # plain steps only: the request ends lagging
    force_picks(sched, monkeypatch, [0])
    prompt, n = random_prompt(26, seed=9), 23
    a = submit(cached, "a", prompt, max_new_tokens=n)
    lag = 0
    while not a.finished:
        lag = a.depth_lag
        catch_ups = cached.spec.num_catch_ups
        step(cached)
    # The last step ran lagging (after a catch-up first when the buffers were full) and settled the depths.
    assert lag > 0 and cached.spec.num_catch_ups == catch_ups + 1 + (lag == cached.spec.lag_capacity)
    assert a.output_ids == SeqRunner(ModelRunner(cached.runner.model, 2, 256, 1024)).greedy(prompt, n)
    tokens = a.fill_ids
    b = submit(cached, "b", tokens, max_new_tokens=4)
    assert cached.run_prefill()
    assert b.cached_tokens == len(tokens) - 1, "the continuation resumes where the request ended"
    c = submit(sched, "c", tokens, max_new_tokens=4)
    assert sched.run_prefill()
    q = len(tokens)
    assert b.kv_len == c.kv_len == q
    assert_same_level_state(cached.runner, b.row, c.row, q, runner_b=sched.runner)
    for s in (cached, sched):
        s.abort("", abort_all=True)
    assert at_baseline(sched)


def test_retraction_while_the_depths_lag(tight, monkeypatch):
    """Too little KV for the batch: requests are retracted (and cached) while plain steps run, and
    resume from the cache; outputs stay the trunk's greedy ones and the pools drain."""
    s = tight
    force_picks(s, monkeypatch, [0, 0, 0, 0, 0, 0, 4])
    prompts = [random_prompt(n, seed=90 + n) for n in (20, 22, 24, 26)]
    reqs = [submit(s, f"t{i}", p, max_new_tokens=30) for i, p in enumerate(prompts)]
    lags, real_retract = [], s.retract_one

    def retract_spy():
        lags.append(max(q.depth_lag for q in s.running))
        real_retract()

    monkeypatch.setattr(s, "retract_one", retract_spy)
    plain_before = s.spec.num_plain_steps
    while any(not r.finished for r in reqs):
        step(s)
    assert lags and max(lags) == 0, "caught up before every retraction (its cache entry covers every level)"
    assert s.spec.num_plain_steps > plain_before
    ref = SeqRunner(ModelRunner(s.runner.model, 2, 256, 1024))
    for r, p in zip(reqs, prompts):
        assert r.output_ids == ref.greedy(p, 30), r.rid
    assert s.flush_cache().success
    assert at_baseline(s)


def test_plain_step_cost_is_timed_on_the_decode_step(sched, monkeypatch):
    """The cost table's k = 0 entry is a plain decode forward (plus its share of a catch-up), not a
    one-token verify: the measurement runs decode forwards and verifies of 2..K + 1 tokens only."""
    from sgl_inkling.model_executor.forward_batch import ForwardMode
    from sgl_inkling.speculative import step_costs
    from sgl_inkling.speculative.verify_graphs import VerifyGraphRunner

    widths, modes = set(), []
    real_step, real_forward = VerifyGraphRunner.step, sched.runner.forward_eager

    def step_spy(self, bs, batch=None):
        widths.add(self.r)
        return real_step(self, bs, batch)

    def forward_spy(batch):
        modes.append(batch.mode)
        return real_forward(batch)

    monkeypatch.setattr(VerifyGraphRunner, "step", step_spy)
    monkeypatch.setattr(sched.runner, "forward_eager", forward_spy)
    costs = step_costs.measure_step_costs(sched.spec, reps=1)
    k = sched.spec.num_steps
    assert widths == set(range(2, k + 2))
    assert ForwardMode.DECODE in modes
    assert len(costs.for_batch(1)) == k + 1
