"""Adaptive draft length: how many drafts a speculative step should verify.

A step that drafts k tokens emits 1 + a_1 + ... + a_k tokens on average, where a_d is the chance
that the first d drafts are all accepted (a_d = c_1 * ... * c_d for the per-depth acceptance rates
c_d = P(draft d accepted | drafts 1..d-1 accepted)), and costs the verify of k + 1 tokens plus the
draft step that produced the k drafts. The chooser maximises tokens per second; k = 0 is a plain
decode step (the decode graph; the depths lag and catch up later, lagging.py).

The rates are running estimates (exponentially weighted per batch) from the verify decisions; the
costs are a table per batch bucket measured at start-up (step_costs.py). A depth that is never
drafted gets no new evidence, so now and then a step drafts deeper than chosen, within a budget of
expected tokens (exploration.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

# Public Inkling MTP8 acceptance (vLLM, GSM8K), a_d per depth: the prior before any evidence and the
# benchmark's default forced curve.
PUBLIC_MTP8_CURVE = (0.757, 0.601, 0.498, 0.411, 0.354, 0.298, 0.261, 0.223)


def conditional_rates(marginal: Sequence[float]) -> list[float]:
    """c_d = a_d / a_{d-1} (a_0 = 1) from the chances a_d that the first d drafts are accepted."""
    out, prev = [], 1.0
    for a in marginal:
        out.append(a / prev if prev > 0 else 0.0)
        prev = a
    return out


def expected_tokens(rates: Sequence[float], k: int) -> float:
    """Tokens a step with k drafts emits on average: 1 + sum_{d<=k} c_1 * ... * c_d."""
    total, run = 1.0, 1.0
    for c in rates[:k]:
        run *= c
        total += run
    return total


def choose_k(rates: Sequence[float], step_cost: Sequence[float]) -> int:
    """The k in [0, len(step_cost) - 1] with the most expected tokens per second; step_cost[k] is
    the time of a step with k drafts. Ties go to the smaller k (less work for the same speed)."""
    best, best_rate = 0, -1.0
    for k, cost in enumerate(step_cost):
        rate = expected_tokens(rates, k) / cost
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
    return best


class AcceptanceTracker:
    """Per-depth acceptance: running estimates for the chooser and all-time counts for the stats.

    Each depth's rate is a weighted mean of its prior (worth PRIOR_OBS observations) and its
    verify decisions. The weight of what it has seen fades by 1 - alpha every serving step (tick),
    so the rate follows the workload over the last ~1 / alpha steps (a batch of 8 judges 8 first
    drafts a step, and its rates are that much steadier), or the last MAX_OBS observations where
    those are fewer (a batch of 64 notices a change within a few steps). The weight never falls
    below a prior's: a rate that has not been drafted for long keeps its value, but the next
    evidence moves it a fifth of the way at least, as a batch-1 step moves a fresh rate.
    Evidence is counted per request judged, but one step's draws are one sample of the batch's
    luck: up to LIFT_BATCH requests a step moves a rate a fifth of the way at most (the weight is
    lifted to PRIOR_OBS per request of the step before the step is added). Without that, the first
    step of a batch of 8 moved a fresh rate two thirds of the way, and an unlucky one dropped the
    batch to plain decode, where no evidence comes to lift it back (in simulation with the H100's
    costs at batch 8, 42 of 100 64-step windows after 42 steps fell below 0.97 of the best k, 13
    with the lift: test_mtp_chooser_sim). A larger batch's step is a steady sample by itself, and
    lifting its weight further only slowed it down (a batch of 64 took 35-69 steps instead of 0-32
    to leave plain decode once useless drafts turned good).
    For choosing, the prior's remaining share of a depth that has seen little evidence is
    optimistic: it is at least the rate of the depth before it. Conditional acceptance does not
    fall with depth in the public curve, and a deep depth that is never drafted gets no evidence;
    a pessimistic guess would keep it undrafted for good, an optimistic one is corrected by the
    first steps that draft it."""

    PRIOR_OBS = 4.0  # 1 made early estimates so noisy that a batch could settle on plain decode
    MAX_OBS = 400.0  # pins a rate within about +-0.02; more would only slow it down
    LIFT_BATCH = 16  # the batch size up to which a step's weight floor grows with it (see above)

    # alpha: 0.05 (20 steps) made batch-1 estimates so noisy that steps fell back to plain decode
    # (0.97-0.98 of the best fixed k in simulation); 0.01 took 200 steps to notice useless drafts.
    def __init__(self, depths: int, alpha: float = 0.02, prior: Sequence[float] | None = None):
        self.alpha = alpha
        prior = conditional_rates(PUBLIC_MTP8_CURVE) if prior is None else list(prior)
        self.prior = [prior[min(d, len(prior) - 1)] for d in range(depths)]
        self.rates = list(self.prior)
        self.prior_share = [1.0] * depths  # the prior's weight in each rate
        self.weight = [self.PRIOR_OBS] * depths  # the observations each rate is worth
        self.reached = [0] * depths  # drafts at depth d that were judged (the ones before accepted)
        self.accepted = [0] * depths

    def update(self, accepted: Sequence[int], drafted: Sequence[int]) -> None:
        """One verify step: request i could accept drafted[i] drafts and accepted accepted[i]."""
        floor = self.PRIOR_OBS * min(len(drafted), self.LIFT_BATCH)  # a fifth of the way at most
        for d in range(len(self.rates)):
            seen = hits = 0
            for a, n in zip(accepted, drafted):
                if n > d and a >= d:  # draft d + 1 was verified after d accepted drafts
                    seen += 1
                    hits += a > d
            if not seen:
                continue
            self.weight[d] = max(self.weight[d], floor)
            keep = self.weight[d] / (self.weight[d] + seen)
            self.rates[d] = keep * self.rates[d] + (1.0 - keep) * hits / seen
            self.prior_share[d] *= keep
            self.weight[d] = min(self.weight[d] + seen, self.MAX_OBS)
            self.reached[d] += seen
            self.accepted[d] += hits

    def judged(self) -> int:
        """Leading depths whose rate rests more on evidence than on the prior."""
        return next((d for d, s in enumerate(self.prior_share) if s > 0.5), len(self.prior_share))

    def tick(self) -> None:
        """One serving step passed: the evidence behind every rate is worth 1 - alpha of what it
        was, never less than a prior (PRIOR_OBS observations)."""
        self.weight = [max(w * (1.0 - self.alpha), self.PRIOR_OBS) for w in self.weight]

    def estimates(self) -> list[float]:
        """The rates the chooser uses: each rate with its prior's share replaced by the larger of
        the prior and the estimate of the depth before (see the class note)."""
        out: list[float] = []
        for d, (rate, share, prior) in enumerate(zip(self.rates, self.prior_share, self.prior)):
            hope = max(prior, out[-1]) if d else prior
            out.append(rate + share * (hope - prior))
        return out

    def optimistic(self) -> list[float]:
        """The estimates raised by one standard error of the evidence behind them (the upper end of
        Wilson's score interval at z = 1, with the weight as the number of observations)."""
        out = []
        for p, n in zip(self.estimates(), self.weight):
            out.append((p + 0.5 / n + (p * (1 - p) / n + 0.25 / n**2) ** 0.5) / (1 + 1 / n))
        return out

    def measured(self) -> list[float | None]:
        """All-time acceptance rate per depth (None where no draft of that depth was verified)."""
        return [a / n if n else None for a, n in zip(self.accepted, self.reached)]


def tail_catch_up_rate(tokens: float, capacity: int) -> float:
    """Catch-ups per step of depths that lag `tokens` a step on average until the next step's would
    overflow `capacity` (about capacity / tokens steps apart, less the part of a step's tokens that
    does not fit at the end)."""
    return tokens / max(capacity + 1 - tokens, 1.0)


@dataclass
class StepCosts:
    """Time per speculative step, by batch bucket and number of drafts: costs[b][k], k = 0..K. With
    tails (lagging.py), tail_catch_up[b][k] is the catch-up of the depths past k, which a step
    drafting k skips (their lag grows by the step's kept tokens, up to tail_capacity)."""

    costs: dict[int, list[float]]
    unit: str = "s"  # "s" when measured, "relative" for the given table
    tail_catch_up: dict[int, list[float]] | None = None
    tail_capacity: int = 0

    def _bucket(self, bs: int) -> int:
        """The smallest measured bucket that holds bs requests (else the largest)."""
        buckets = sorted(self.costs)
        return buckets[min(bisect.bisect_left(buckets, bs), len(buckets) - 1)]

    def for_batch(self, bs: int) -> list[float]:
        """The step times of bs requests' bucket."""
        return self.costs[self._bucket(bs)]

    def expected(self, bs: int, rates: Sequence[float]) -> list[float]:
        """The step times of bs requests with each k's share of its tails' catch-ups, at the kept
        tokens a step emits under `rates`: what the chooser compares."""
        b = self._bucket(bs)
        cost = self.costs[b]
        if self.tail_catch_up is None:
            return cost
        return [c + t * tail_catch_up_rate(expected_tokens(rates, k), self.tail_capacity)
                for k, (c, t) in enumerate(zip(cost, self.tail_catch_up[b]))]  # fmt: skip

    @classmethod
    def given(cls, num_steps: int) -> StepCosts:
        """The table used without CUDA graphs (CPU): relative units shaped like a bandwidth-bound GPU
        step at batch 1 (each verified token adds 0.3 of a decode step, each drafting depth 0.1),
        since eager CPU timings of a small model are noise and would only slow start-up."""
        return cls({1: [1.0 + 0.4 * k for k in range(num_steps + 1)]}, unit="relative")

    def as_dict(self) -> dict:
        """For the server info: milliseconds (or relative units) per bucket, k = 0..K."""
        scale = 1e3 if self.unit == "s" else 1.0
        by_bucket = {str(b): [round(c * scale, 4) for c in v] for b, v in sorted(self.costs.items())}
        out = {"unit": "ms" if self.unit == "s" else self.unit, "by_batch_bucket": by_bucket}
        if self.tail_catch_up is not None:
            out["tail_catch_up_by_batch_bucket"] = {str(b): [round(c * scale, 4) for c in v]
                                                    for b, v in sorted(self.tail_catch_up.items())}  # fmt: skip
            out["tail_capacity"] = self.tail_capacity
        return out
