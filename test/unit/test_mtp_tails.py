"""MTP depths past a step's drafting ones skip the step and lag (speculative/lagging.py's tails): a
step drafting k runs depths 0..k-1 only, and depths k.. consume what they lag in one pass when it
would overflow their buffers (2K + 1 tokens), when k changes, and before the radix tree caches the
request. The chooser counts each k's share of those catch-ups.

References: the trunk's own greedy loop (SeqRunner, no MTP) for outputs; a cold prefill of the same
tokens for the state every level holds once the tails caught up (on inkling-tiny-draftable, window
16, and inkling-tiny-w512, the real window of 512); the depths each forward ran, counted by a spy;
a brute-force simulation of the lag for the catch-up rate.
"""

from __future__ import annotations

import itertools
import random

import pytest

from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner
from sgl_inkling.speculative.adaptive import (
    PUBLIC_MTP8_CURVE,
    StepCosts,
    choose_k,
    conditional_rates,
    expected_tokens,
    tail_catch_up_rate,
)

from .helpers import assert_same_level_state, draftable_scheduler, in_process_scheduler, random_prompt
from .test_mtp_plain_steps import at_baseline, force_picks, step, submit


@pytest.fixture(scope="module")
def sched(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory)


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory, radix=True)


@pytest.fixture(scope="module")
def w512(tmp_path_factory):
    from sgl_inkling.models.inkling.tiny_window import ensure_tiny_window_checkpoint
    from sgl_inkling.server_args import ServerArgs

    args = ServerArgs(model_path=str(ensure_tiny_window_checkpoint()), device="cpu", speculative_algorithm="MTP",
                      disable_radix_cache=True)  # fmt: skip
    with in_process_scheduler(args, tmp_path_factory) as s:
        yield s


@pytest.fixture(autouse=True)
def fixed_shapes(request):
    """Tails run on the fixed-shape draft step (what CUDA graphs replay; eager on the CPU)."""
    scheds = [request.getfixturevalue(n) for n in ("sched", "cached", "w512") if n in request.fixturenames]
    for s in scheds:
        s.spec.fixed_shapes = True
    yield
    for s in scheds:
        s.spec.fixed_shapes = False


def depth_runs(s, monkeypatch) -> list[list[int]]:
    """The depths each fixed-shape draft pass (DraftStep.run) runs, in order."""
    runs: list[list[int]] = []
    real_forward, real_run = s.runner.forward_mtp, s.spec.step.run

    def forward_spy(depth, hidden, batch):
        runs[-1].append(depth)
        return real_forward(depth, hidden, batch)

    def run_spy(*args, **kw):
        runs.append([])
        return real_run(*args, **kw)

    monkeypatch.setattr(s.runner, "forward_mtp", forward_spy)
    monkeypatch.setattr(s.spec.step, "run", run_spy)
    return runs


def trunk_greedy(s, prompt, n):
    return SeqRunner(ModelRunner(s.runner.model, 2, 256, 1024)).greedy(prompt, n)


def test_a_step_runs_only_its_drafting_depths(sched, monkeypatch):
    """k = 3 every step: the draft passes run depths 0..2, and depths 3..7 run only in catch-up passes
    of their own, about as often as a lag of up to 2K + 1 tokens allows; outputs are the trunk's."""
    s, k = sched, 3
    force_picks(s, monkeypatch, [k])
    prompt, n = random_prompt(30, seed=11), 90
    a = submit(s, "a", prompt, max_new_tokens=n)
    step(s)  # the prefill and its first drafts (every depth, the ragged chain)
    runs, ups = depth_runs(s, monkeypatch), s.spec.num_tail_catch_ups
    lags, steps = [], 0
    while not a.finished:
        step(s)
        steps += 1
        lags.append((a.depth_lag, a.lag_from))
    assert a.output_ids == trunk_greedy(s, prompt, n)
    big = s.spec.num_steps
    tail = list(range(k, big))
    assert runs and all(r in (list(range(k)), tail) for r in runs), runs
    catch_ups = s.spec.num_tail_catch_ups - ups
    assert runs.count(tail) == catch_ups > 0
    assert runs.count(list(range(k))) == steps
    cap = s.spec.tail_capacity
    assert max(lag for lag, _ in lags) <= cap
    assert {f for lag, f in lags if lag} == {k}
    # A catch-up each time the lag would pass 2K + 1 tokens (of the n the steps kept): a step keeps at
    # most k + 1, so the lag is past C - k - 1 then.
    assert n / cap - 1 <= catch_ups <= n / (cap - k) + 1
    assert at_baseline(s)


# k switches up and down, runs long enough to overflow the tails' buffers, k = K (no tail) and plain steps.
PICKS = [3] * 9 + [5, 2, 2, 8, 1, 4, 4, 0, 0, 3, 6, 6, 2, 7]


def test_tails_caught_up_hold_the_state_of_a_cold_prefill(sched, monkeypatch):
    """Stopped while depths lag, then caught up: every level holds exactly the state of the tokens
    (a second request prefilling the same tokens cold)."""
    s = sched
    force_picks(s, monkeypatch, PICKS)
    a = submit(s, "a", random_prompt(29, seed=5), max_new_tokens=400)
    seen = set()
    while len(a.output_ids) < 70 or not (a.depth_lag and a.lag_from):
        step(s)
        seen.add(a.lag_from if a.depth_lag else None)
    assert len(seen - {None}) >= 3, f"tails of several k lagged: {seen}"
    s.spec.catch_up_tails([a])
    assert a.depth_lag == 0
    q = a.kv_len
    b = submit(s, "b", a.fill_ids[:q], max_new_tokens=4)
    assert s.run_prefill()  # only b's prefill (and its first drafts): a does not move
    assert b.kv_len == q and a.kv_len == q
    assert_same_level_state(s.runner, a.row, b.row, q)
    s.abort("", abort_all=True)
    assert at_baseline(s)


def test_tails_across_the_real_window(w512, monkeypatch):
    """inkling-tiny-w512 (window 512): a request past its window with depths lagging keeps the sliding
    KV they still read (the trunk alone would release it), and once caught up holds a cold
    prefill's state; the pools drain."""
    s = w512
    force_picks(s, monkeypatch, [2])
    prompt = random_prompt(500, seed=3)
    a = submit(s, "a", prompt, max_new_tokens=200)
    while a.kv_len < 530 or a.depth_lag < 12 or not a.lag_from:
        step(s)
    window = s.runner.model.cfg.sliding_window_size
    reach = a.kv_len - a.depth_lag - window + 1  # the oldest position the lagging depths attend to
    assert reach < a.kv_len - window + 1
    assert (s.kv.rows.read("swa", a.row, reach, a.kv_len) > 0).all(), "sliding KV of lagging depths released"
    s.spec.catch_up_tails([a])
    q = a.kv_len
    b = submit(s, "b", a.fill_ids[:q], max_new_tokens=4)
    while b.kv_len < q:  # in chunks
        assert s.run_prefill()
    assert b.kv_len == q and a.kv_len == q
    assert_same_level_state(s.runner, a.row, b.row, q)
    s.abort("", abort_all=True)
    assert at_baseline(s)


def test_request_finishing_with_lagging_tails_caches_every_level(cached, sched, monkeypatch):
    """A request that ends while depths past k lag is cached with them caught up: its continuation,
    resumed from that cache entry, holds a cold prefill's state (in the scheduler without a cache)."""
    force_picks(cached, monkeypatch, [2])
    force_picks(sched, monkeypatch, [2])
    prompt, n = random_prompt(26, seed=9), 31
    a = submit(cached, "a", prompt, max_new_tokens=n)
    lag, ups = 0, cached.spec.num_tail_catch_ups
    while not a.finished:
        lag = a.depth_lag
        step(cached)
    assert lag > 0, "the request ended with its tail lagging"
    assert cached.spec.num_tail_catch_ups > ups
    assert a.output_ids == trunk_greedy(cached, prompt, n)
    tokens = a.fill_ids
    b = submit(cached, "b", tokens, max_new_tokens=4)
    assert cached.run_prefill()
    assert b.cached_tokens == len(tokens) - 1, "the continuation resumes where the request ended"
    c = submit(sched, "c", tokens, max_new_tokens=4)
    assert sched.run_prefill()
    assert b.kv_len == c.kv_len == len(tokens)
    assert_same_level_state(cached.runner, b.row, c.row, len(tokens), runner_b=sched.runner)
    for s in (cached, sched):
        s.abort("", abort_all=True)
    assert at_baseline(sched)


def simulate_catch_ups(rates, k: int, capacity: int, steps: int, seed: int = 0) -> float:
    """Catch-ups per step, brute force: each step keeps 1 + accepted drafts (accepted under the
    conditional rates), and the tail catches up first when the step's tokens would overflow."""
    rng, lag, ups = random.Random(seed), 0, 0
    for _ in range(steps):
        kept = 1 + sum(1 for _ in itertools.takewhile(lambda c: rng.random() < c, rates[:k]))
        if lag + kept > capacity:
            ups, lag = ups + 1, 0
        lag += kept
    return ups / steps


def test_catch_up_rate_matches_a_simulation():
    rates = conditional_rates(PUBLIC_MTP8_CURVE)
    for k in range(1, 8):
        est = tail_catch_up_rate(expected_tokens(rates, k), 17)
        sim = simulate_catch_ups(rates, k, 17, 50_000, seed=k)
        assert abs(est - sim) <= 0.1 * sim, (k, est, sim)


def test_chooser_counts_the_tails_share():
    """Steps that skip the tail are cheap but the catch-ups are dear: the chooser's pick is the best
    k of a brute-force simulation of tokens over time with the catch-ups paid when they happen."""
    rates = conditional_rates(PUBLIC_MTP8_CURVE)
    step_cost = [1.0 + 0.35 * k for k in range(9)]
    picks = {}
    for dear in (0.0, 0.1, 2.0, 6.0):
        tails = [0.0] + [dear * (8 - k) for k in range(1, 8)] + [0.0]
        costs = StepCosts({1: step_cost}, tail_catch_up={1: tails}, tail_capacity=17)
        picks[dear] = picked = choose_k(rates, costs.expected(1, rates))
        rate = {}
        for k in range(9):
            ups = simulate_catch_ups(rates, k, 17, 20_000) if 0 < k < 8 else 0.0
            rate[k] = expected_tokens(rates, k) / (step_cost[k] + ups * tails[k])
        best = max(rate, key=rate.get)
        assert rate[picked] >= 0.99 * rate[best], (dear, picked, best, rate)
    # Dearer catch-ups move the pick deeper (the depths past it are fewer; k = 8 has no tail at all).
    assert picks[0.0] <= picks[2.0] <= picks[6.0] and picks[0.0] < picks[6.0], picks


def test_a_request_leaving_keeps_the_batchs_drafts(cached, monkeypatch):
    """A request that finishes while another's tail lags: caching it catches its own depths up (a
    non-drafting catch-up), and the batch keeps drafting the k the chooser picked. That catch-up
    used to set the batch's k to 0, so the next step ran plain decode over a request whose tail
    lagged, which the plain step refuses: the H100's exact MTP test failed its remaining requests
    so. The survivor's output is the trunk's; no plain step ran."""
    s = cached
    force_picks(s, monkeypatch, [2])
    pa, pb = random_prompt(24, seed=21), random_prompt(27, seed=22)
    a = submit(s, "a", pa, max_new_tokens=9)
    b = submit(s, "b", pb, max_new_tokens=40)
    plain = s.spec.num_plain_steps
    lagged_at_finish = None
    while not b.finished:
        was_running = not a.finished
        step(s)
        if was_running and a.finished:
            lagged_at_finish = (b.depth_lag, b.lag_from)
            assert s.spec.k == 2, "the leaving request's catch-up changed the batch's k"
    assert lagged_at_finish is not None and lagged_at_finish[0] and lagged_at_finish[1] == 2, lagged_at_finish
    assert s.spec.num_plain_steps == plain
    assert b.output_ids == trunk_greedy(s, pb, 40)
    assert a.output_ids == trunk_greedy(s, pa, 9)
    s.abort("", abort_all=True)
