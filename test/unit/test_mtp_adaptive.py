"""The adaptive draft length's pure parts: the chooser against brute force, the acceptance tracker
against known rates, the cost table lookup."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from sgl_inkling.speculative.adaptive import (
    PUBLIC_MTP8_CURVE,
    AcceptanceTracker,
    StepCosts,
    choose_k,
    conditional_rates,
    expected_tokens,
)


def brute_force_tokens(rates: list[float], k: int) -> float:
    """Expected emitted tokens of a k-draft step, over every accept/reject outcome of the k depths
    (depth d accepts with rate c_d, independently): 1 + the leading accepted drafts."""
    total = 0.0
    for outcome in itertools.product((False, True), repeat=k):
        p = 1.0
        for c, ok in zip(rates, outcome):
            p *= c if ok else 1 - c
        lead = next((i for i, ok in enumerate(outcome) if not ok), k)
        total += p * (1 + lead)
    return total


def brute_force_best(rates: list[float], costs: list[float]) -> tuple[int, list[float]]:
    speeds = [brute_force_tokens(rates, k) / c for k, c in enumerate(costs)]
    return max(range(len(costs)), key=lambda k: (speeds[k], -k)), speeds


def test_public_curve_gives_its_accept_length():
    rates = conditional_rates(PUBLIC_MTP8_CURVE)
    assert expected_tokens(rates, 8) == pytest.approx(1 + sum(PUBLIC_MTP8_CURVE))  # 4.403
    assert expected_tokens(rates, 8) == pytest.approx(brute_force_tokens(rates, 8))


def test_chooser_picks_what_brute_force_says_is_fastest():
    rng = random.Random(7)
    picked = set()
    for _ in range(400):
        depths = rng.randint(1, 8)
        rates = [rng.random() ** rng.choice((0.2, 1, 3)) for _ in range(depths)]
        # Costs shaped like real steps: a base, a per-token verify growth, per-depth draft cost, noise.
        base, per_tok, per_depth = 1.0, rng.uniform(0, 0.8), rng.uniform(0, 0.4)
        costs = [base + (per_tok + per_depth) * k * rng.uniform(0.9, 1.1) for k in range(depths + 1)]
        if rng.random() < 0.5:  # k = 0 is a plain decode step: often much cheaper than any verify
            costs[0] = base * rng.uniform(0.2, 1.0)
        want, speeds = brute_force_best(rates, costs)
        got = choose_k(rates, costs)
        assert speeds[got] == pytest.approx(speeds[want], rel=1e-9), (rates, costs, got, want)
        picked.add(got)
    assert len(picked) >= 5, "the synthetic cases should exercise many different k"


def test_chooser_extremes():
    assert choose_k([0.0] * 8, [1.0 + 0.1 * k for k in range(9)]) == 0  # drafts never right: plain decode
    assert choose_k([1.0] * 8, [1.0 + 0.1 * k for k in range(9)]) == 8  # always right, cheap: all of them
    assert choose_k([0.9] * 8, [1.0] * 9) == 8  # free drafts are always worth it
    # A wide batch where verifying costs far more than a plain decode step: no k pays on the public curve.
    assert choose_k(conditional_rates(PUBLIC_MTP8_CURVE), [1.0] + [2.0 + 0.6 * k for k in range(1, 9)]) == 0


def test_tracker_measures_conditional_rates():
    """Simulated steps where depth d accepts with rate p_d after the ones before it were accepted:
    the all-time rates match p_d within sampling error and the running ones follow them."""
    p = [0.8, 0.6, 0.9, 0.5]
    rng = random.Random(3)
    t = AcceptanceTracker(4, alpha=0.02)
    for _ in range(3000):
        drafted = [rng.choice((2, 4, 4)) for _ in range(4)]  # some requests draft (or may accept) fewer
        accepted = []
        for n in drafted:
            a = 0
            while a < n and rng.random() < p[a]:
                a += 1
            accepted.append(a)
        t.update(accepted, drafted)
    for d, (got, want) in enumerate(zip(t.measured(), p)):
        sd = (want * (1 - want) / t.reached[d]) ** 0.5
        assert abs(got - want) < 4 * sd, (d, got, want)
        assert abs(t.rates[d] - want) < 0.15, (d, t.rates[d], want)
    assert t.reached[0] == 3000 * 4


def test_cost_table_lookup():
    c = StepCosts({1: [1.0], 8: [2.0], 64: [3.0]})
    assert [c.for_batch(b)[0] for b in (1, 2, 8, 9, 64, 200)] == [1.0, 2.0, 2.0, 3.0, 3.0, 3.0]


def test_token_map_file_is_validated(tmp_path):
    from sgl_inkling.speculative.token_map import load_token_map

    good = tmp_path / "hot.pt"
    torch.save([5, 3, 9], good)
    assert load_token_map(str(good), 10).tolist() == [5, 3, 9]
    torch.save(torch.tensor([1, 2, 3], dtype=torch.int32), good)  # upstream saves tensors too
    assert load_token_map(str(good), 10).dtype == torch.int64
    for bad, why in (([1, 10], "0..9"), ([2, 2], "repeat"), ([[1, 2]], "1-D"), ([0.5], "integer"), ([], "non-empty")):
        torch.save(torch.tensor(bad), good)
        with pytest.raises(ValueError, match="--speculative-token-map.*" + why):
            load_token_map(str(good), 10)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="--speculative-token-map: cannot read"):
        load_token_map(str(tmp_path / "junk.pt"), 10)


def test_adaptive_and_token_map_flags(monkeypatch):
    from sgl_inkling.server_args import ServerArgsError, parse_server_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    base = ["--model-path", "x", "--speculative-algorithm", "MTP"]
    assert parse_server_args(base).speculative_adaptive  # on by default
    a = parse_server_args([*base, "--no-speculative-adaptive", "--speculative-token-map", "hot.pt"])
    assert not a.speculative_adaptive and a.speculative_token_map == "hot.pt"
    with pytest.raises((ServerArgsError, SystemExit)):
        parse_server_args(["--model-path", "x", "--speculative-token-map", "hot.pt"])  # needs MTP


def _graph_runner(cap: int, vocab: int = 1000, dtype=torch.bfloat16):
    from types import SimpleNamespace

    from sgl_inkling.model_executor.cuda_graph_runner import buckets_up_to

    cfg = SimpleNamespace(vocab_size=vocab)
    return SimpleNamespace(graphs=SimpleNamespace(buckets=buckets_up_to(cap)), model=SimpleNamespace(cfg=cfg), dtype=dtype)


def _kept_by_brute_force(widths, buckets, vocab: int, item: int) -> int:
    """What the captured verify graphs hold between replays: each (width, bucket) graph its own
    bucket x width logits rows."""
    return sum(b * w * vocab * item for w in widths for b in buckets)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_speculative_graph_batches_follow_cuda_graph_max_bs_where_memory_allows(dtype):
    """graph_max_bs counts the logits every (width, bucket) verify graph keeps alive (adaptive MTP8
    captures 9 widths: 45 rows of logits per request of every bucket, not 9 of the largest), so a
    model whose free memory held 128 of them by the old count is cut to what really fits. The
    logits are float32 at either model dtype (test_verify_logits_are_float32_in_a_bf16_model)."""
    from sgl_inkling.model_executor.cuda_graph_runner import buckets_up_to
    from sgl_inkling.speculative.verify_graphs import LOGITS_MEMORY_SHARE, graph_max_bs, kept_logits_bytes

    item = 4  # bytes a kept logit: float32 whatever the model's dtype

    vocab, adaptive, fixed = 1000, range(9, 0, -1), [9]
    for widths in (adaptive, fixed):
        for cap in (32, 128, 256):
            runner = _graph_runner(cap, vocab, dtype)
            for bs in buckets_up_to(cap):
                assert kept_logits_bytes(runner, widths, bs) == _kept_by_brute_force(widths, buckets_up_to(bs), vocab, item)

            def need(bs, widths=widths):  # kept logits plus the widest verify's fp32 logits as capture headroom
                return _kept_by_brute_force(widths, buckets_up_to(bs), vocab, item) + bs * max(widths) * vocab * 4

            for free_for in (1, 8, 60, 100, 128, 300):
                free = int(need(free_for) / LOGITS_MEMORY_SHARE) + 1
                got = graph_max_bs(runner, widths, free)
                fitting = [b for b in buckets_up_to(cap) if need(b) <= LOGITS_MEMORY_SHARE * free]
                assert got == (fitting[-1] if fitting else 0), (list(widths), cap, free_for, got)
                assert got <= cap and (got == 0 or need(got) <= LOGITS_MEMORY_SHARE * free)
    assert graph_max_bs(_graph_runner(256), adaptive, 0) == 0  # no room: no graphs (eager verify)
    # The OOM this replaced: tiny-draftable in float32 on an H200 (about 21 GiB left after the pools),
    # cuda-graph-max-bs 128, adaptive MTP8 over a 201,024-token vocabulary kept 25.7 GB of logits.
    big = _graph_runner(128, 201_024, torch.float32)
    assert kept_logits_bytes(big, adaptive, 128) > 25e9
    assert 0 < graph_max_bs(big, adaptive, 21 * 2**30) < 128


def test_verify_logits_are_float32_in_a_bf16_model(tiny_path):
    """What graph_max_bs counts 4 bytes a logit for: the logits a bf16 model returns (and a verify
    graph keeps) are float32, over the padded vocabulary in memory."""
    from sgl_inkling.model_executor.model_loader import load_model

    model = load_model(tiny_path, torch.bfloat16, "cpu")
    h = torch.randn(3, model.cfg.hidden_size, dtype=torch.bfloat16)
    logits = model.logits(h)
    assert logits.dtype == torch.float32
    assert logits.untyped_storage().nbytes() >= 3 * model.cfg.vocab_size * 4


def _control(costs: list[float]):
    from sgl_inkling.speculative.draft_control import DraftControl

    c = DraftControl()
    c.num_steps = len(costs) - 1
    c._init_draft_control(c.num_steps, adaptive=True)
    c.costs = StepCosts({1: costs})
    return c


def test_exploration_spends_within_its_budget_of_expected_tokens():
    """Drafts that are never right: the chooser settles on plain decode, and the steps that draft
    anyway give up, in expected tokens under the estimates, at most EXPLORE_LOSS of the tokens;
    where every k costs the same, exploring is free and happens every step."""
    from sgl_inkling.speculative.exploration import EXPLORE_LOSS

    costs = [1.0] + [2.0 + 0.1 * k for k in range(1, 9)]  # the first draft doubles a step
    c = _control(costs)
    given_up = tokens = 0.0
    for _ in range(5000):
        k = c.choose(1)
        if k:
            c.observe([0], [k])
            given_up += costs[k] - 1.0  # a plain step would have emitted that many more tokens
        tokens += 1.0
    assert c.tracker.estimates()[0] < 0.05
    assert 0 < given_up <= 1.3 * EXPLORE_LOSS * tokens  # it explores, about within its budget
    assert c.explorer.spent <= c.explorer.earned <= 1.01 * EXPLORE_LOSS * tokens
    free = _control([1.0] * 9)
    free.tracker = AcceptanceTracker(8, prior=[0.0])  # nothing seems worth drafting, every k costs the same
    ks = [free.choose(1) for _ in range(100)]
    assert ks == [1] * 100  # free evidence: one depth past the judged ones (none) every step


def test_exploration_target_against_brute_force():
    """The target is, up to one depth past the judged ones, the deeper k whose speed with the
    depths past the chosen k at their optimistic rates is highest among those that would beat the
    chosen k; where none would, the cheapest from plain decode (k = 0 judges nothing) and none
    from a drafting k. Its loss is what a step at it gives up against the chosen k."""
    from sgl_inkling.speculative.exploration import exploration_target

    rng = random.Random(11)
    outcomes = set()
    for _ in range(400):
        rates = [rng.uniform(0.1, 0.95) for _ in range(8)]
        hopes = [min(1.0, r + rng.uniform(0, 0.4)) for r in rates]
        costs = sorted(rng.uniform(1.0, 4.0) for _ in range(9))
        k, judged = rng.choice((0, 0, *range(8))), rng.randint(0, 8)
        got = exploration_target(rates, hopes, costs, k, judged)
        speed = lambda r, j, costs=costs: brute_force_tokens(r, j) / costs[j]  # noqa: E731
        deeper = range(k + 1, min(8, max(judged + 1, k + 1)) + 1)
        hoped = {j: speed(rates[:k] + hopes[k:], j) for j in deeper}
        reach = [j for j in deeper if hoped[j] > speed(rates, k)]
        if reach:
            want = max(reach, key=lambda j: hoped[j])
        elif k == 0:
            want = max(deeper, key=lambda j: speed(rates, j))
        else:
            assert got is None, (rates, hopes, costs, k, judged)
            outcomes.add("none")
            continue
        target, loss = got
        assert target == want, (rates, hopes, costs, k, judged)
        assert loss == pytest.approx(max(0.0, (speed(rates, k) - speed(rates, target)) * costs[target]))
        outcomes.add("reach" if reach else "cheapest")
    assert outcomes == {"none", "reach", "cheapest"}
    assert exploration_target([0.5] * 8, [0.6] * 8, [1.0] * 9, 8, 8) is None  # nothing deeper than K


def test_estimates_are_optimistic_only_where_evidence_is_missing():
    """A depth never judged is assumed as good as the depth before it; evidence replaces the guess."""
    t = AcceptanceTracker(3, prior=[0.5])
    for _ in range(50):
        t.update([1], [1])  # depth 1 always accepted, depths 2 and 3 never drafted
    est = t.estimates()
    assert est[0] > 0.9 and est[1] == pytest.approx(est[0]) and est[2] == pytest.approx(est[0])
    for _ in range(200):
        t.update([1], [3])  # now depth 2 is drafted and always rejected
    est = t.estimates()
    assert est[0] > 0.9 and est[1] < 0.1
    assert est[2] == pytest.approx(0.5)  # still never judged: at least its prior, the depth before is worse


def test_mtp_graph_capture_counts_as_warm_up():
    """Kernels compiled while the MTP graphs are captured and timed at start-up keep no request
    waiting: jit_watch must not warn about them (it does about compiles once serving)."""
    from types import SimpleNamespace

    from sgl_inkling.speculative.mtp_worker import MTPWorker
    from sgl_inkling_kernels import jit_watch

    seen = []
    # A runner that skipped kernel warm-up (the CPU): the depths' own warm-up is not run here.
    runner = SimpleNamespace(kernel_warmup=False)
    worker = SimpleNamespace(runner=runner, _capture_graphs=lambda: seen.append(jit_watch._warming))
    MTPWorker.capture_graphs(worker)
    assert seen == [1] and jit_watch._warming == 0
