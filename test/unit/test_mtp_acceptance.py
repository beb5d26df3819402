"""Adaptive MTP inside the scheduler, in-process, with drafts right at known per-depth rates
(draft_oracle.DraftOracle): the per-depth acceptance the server reports matches those rates, the
chooser settles on the k that brute force says is fastest for them, and greedy output stays the
plain greedy loop's token for token whatever k each step uses."""

from __future__ import annotations

import pytest
import torch

from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.managers.scheduler import Scheduler
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner
from sgl_inkling.sampling.sampling_params import SamplingParams
from sgl_inkling.speculative.adaptive import StepCosts, choose_k, expected_tokens

from .draft_oracle import DraftOracle
from .helpers import draftable_scheduler, random_prompt

# Conditional per-depth rates; depth 2's is far from the chance of reaching past it (0.6 * 0.95).
P = [0.6, 0.95, 0.9, 0.95, 0.9, 0.95, 0.9, 0.95]


@pytest.fixture(scope="module")
def sched(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory)


@pytest.fixture(scope="module")
def plain(sched):
    return SeqRunner(ModelRunner(sched.runner.model, 2, 512, 1024))


def run_with_oracle(s: Scheduler, plain: SeqRunner, tag: str, n: int, new_tokens: int) -> None:
    """n greedy requests at once, drafted by the oracle: their outputs are the plain greedy loop's."""
    k = s.spec.num_steps
    prompts = [random_prompt(9 + 7 * i, seed=300 + i) for i in range(n)]
    want = [plain.greedy(p, new_tokens + k + 2) for p in prompts]  # drafts look past the last token
    refs = {f"{tag}{i}": p + w for i, (p, w) in enumerate(zip(prompts, want))}
    oracle = DraftOracle(s.spec, P, refs, s.vocab, seed=5)
    reqs = []
    for i, p in enumerate(prompts):
        sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, "max_new_tokens": new_tokens})
        s.handle(TokenizedGenerateReq(rid=f"{tag}{i}", input_ids=list(p), sampling_params=sp))
        reqs.append(s.waiting[-1])
    try:
        while any(not r.finished for r in reqs):
            s.step()
            s.outbox.clear()
    finally:
        oracle.remove()
    assert [r.output_ids for r in reqs] == [w[:new_tokens] for w in want]
    assert oracle.proposed[0] > 0


def test_measured_acceptance_matches_the_drafts_rates(sched, plain):
    s = sched
    s.spec.configure(adaptive=False)  # all 8 depths every step: every depth gets evidence
    run_with_oracle(s, plain, "acc", n=6, new_tokens=60)
    st = s.internal_state()
    rates, seen = st["spec_accept_rate_by_depth"], st["spec_verified_drafts_by_depth"]
    assert st["spec_draft_steps_by_k"][-1] > 0 and sum(st["spec_draft_steps_by_k"][:-1]) == 0
    assert seen[-1] >= 20, seen
    for d, (got, want, n) in enumerate(zip(rates, P, seen)):
        sd = (want * (1 - want) / n) ** 0.5
        assert abs(got - want) < 3.5 * sd + 1e-9, (d, got, want, n)
    assert abs(rates[1] - P[0] * P[1]) > 0.2  # not the running product
    s.abort("")
    assert s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots


def test_adaptive_settles_on_the_fastest_k(sched, plain):
    """Costs where, for these rates, 3 drafts are clearly fastest: the steps draft 3 as the
    estimates move from the public prior to these rates, and never explore deeper (even perfect
    depths past 3 could not make 4 or more faster); outputs stay greedy's. Greedy output under
    steps of different k: test_mtp_scheduler, test_mtp_plain_steps."""
    s = sched
    costs = [1.0, 1.45, 1.75, 1.9, 2.6, 2.9, 3.2, 3.5, 3.8]
    best = choose_k(P, costs)
    speed = [expected_tokens(P, k) / c for k, c in enumerate(costs)]
    assert best == 3 and all(speed[best] > 1.1 * speed[k] for k in range(9) if k != best)
    s.spec.configure(adaptive=True, costs=StepCosts({1: costs}))
    before = list(s.spec.k_steps)
    run_with_oracle(s, plain, "ada", n=4, new_tokens=80)
    used = [a - b for a, b in zip(s.spec.k_steps, before)]
    assert used[best] == sum(used) > 20, used
    assert abs(s.spec.tracker.rates[0] - P[0]) < 0.1  # moved from the prior (0.757) to these rates
    assert s.spec.k == best, (s.spec.k, used)
    s.abort("")
    assert s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots


@pytest.mark.parametrize("fixed", [False, True], ids=["ragged-chain", "fixed-shape-step"])
def test_token_map_drafts_over_the_subset_and_output_is_unchanged(sched, plain, fixed):
    """Depths draft over a draft vocabulary (their logits are that wide), the trunk still verifies
    over the full one: greedy output is the plain loop's with a map that holds the continuations
    (drafts accepted) and with one that holds none of them (every draft rejected)."""
    s = sched
    prompts = [random_prompt(20 + 9 * i, seed=600 + i) for i in range(3)]
    want = [plain.greedy(p, 30) for p in prompts]
    used = sorted({t for w in want for t in w})
    others = [t for t in range(s.vocab) if t not in set(used)]
    widths: set[int] = set()
    orig = s.runner.forward_mtp

    def forward_mtp(depth, prev, batch):
        out = orig(depth, prev, batch)
        if out.logits.shape[0]:
            widths.add(out.logits.shape[1])
        return out

    s.spec.configure(adaptive=False)
    s.spec.fixed_shapes = fixed
    s.runner.forward_mtp = forward_mtp
    try:
        for name, vocab in (("hit", used + others[:40]), ("miss", others[:200])):
            s.runner.model.set_draft_vocab(torch.tensor(vocab))
            widths.clear()
            reqs = []
            for i, p in enumerate(prompts):
                sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, "max_new_tokens": 30})
                s.handle(TokenizedGenerateReq(rid=f"map{name}{fixed}{i}", input_ids=list(p), sampling_params=sp))
                reqs.append(s.waiting[-1])
            while any(not r.finished for r in reqs):
                s.step()
                s.outbox.clear()
            assert [r.output_ids for r in reqs] == want, name
            assert widths == {len(vocab)}, (name, widths)
            accepted = sum(r.spec_accepted_drafts for r in reqs)
            assert (accepted > 10) if name == "hit" else (accepted == 0), (name, accepted)
    finally:
        s.runner.forward_mtp = orig
        s.runner.model.set_draft_vocab(None)
        s.spec.fixed_shapes = False
    assert s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots
