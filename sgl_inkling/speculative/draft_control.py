"""How many drafts each MTP step makes (mixed into MTPWorker): the adaptive choice from measured
step costs and running acceptance (adaptive.py), and the benchmark-only forced acceptance."""

from __future__ import annotations

import random

from sgl_inkling.speculative.adaptive import AcceptanceTracker, StepCosts, choose_k
from sgl_inkling.speculative.exploration import ExplorationBudget


class DraftControl:
    """Needs num_steps; sets up its state in _init_draft_control."""

    def _init_draft_control(self, num_steps: int, adaptive: bool) -> None:
        self.adaptive = adaptive
        self.tracker = AcceptanceTracker(num_steps)
        self.costs: StepCosts | None = None
        self.k = num_steps  # drafts of the step being drafted now
        self.k_steps = [0] * (num_steps + 1)  # draft steps per chosen k
        self.explorer = ExplorationBudget()
        self.forced_accept: float | None = None  # benchmark-only switch (bench_one_batch --mtp-accept)
        self._forced_credit = 0.0
        # Benchmark-only: a_d, the chance that the first d drafts are accepted (bench --mtp-accept-curve).
        self.forced_curve: list[float] | None = None
        self._forced_rng = random.Random(0)

    def choose(self, bs: int) -> int:
        """Drafts for the next step of a batch of bs requests (called once per serving step): K
        unless adaptive; else the best k for the measured costs and running acceptance, or a deeper
        one to explore within its budget (exploration.py)."""
        k = self.num_steps
        if self.adaptive and self.costs is not None:
            self.tracker.tick()
            rates = self.tracker.estimates()
            cost = self.costs.expected(max(bs, 1), rates)
            k = self.explorer.pick(self.tracker, rates, cost, choose_k(rates, cost))
        self.k_steps[k] += 1
        return k

    def configure(self, adaptive: bool, costs: StepCosts | None = None) -> None:
        """Turn adaptive drafting on or off (tests, benchmarks), optionally with a cost table; the
        acceptance estimates and step counts start afresh."""
        self.adaptive = adaptive
        self.costs = costs or self.costs or StepCosts.given(self.num_steps)
        self.tracker = AcceptanceTracker(self.num_steps)
        self.k_steps = [0] * (self.num_steps + 1)
        self.explorer = ExplorationBudget()
        self.k = self.choose(1)

    def observe(self, accepted: list[int], drafted: list[int]) -> None:
        """One verify's decisions: request i accepted accepted[i] of the drafted[i] it could."""
        self.tracker.update(accepted, drafted)

    def forced_counts(self, n: int) -> list[int] | None:
        """Benchmark-only: accept lengths averaging `forced_accept` tokens per step (e.g. 2.5 gives
        drafts accepted 1, 2, 1, 2, ... so each step emits 2 or 3 tokens), or drawn per request
        from `forced_curve` (a_d: the chance that the first d drafts are accepted)."""
        if self.forced_curve is not None:
            return [self._draw_forced() for _ in range(n)]
        if self.forced_accept is None:
            return None
        self._forced_credit += self.forced_accept - 1.0
        a = int(self._forced_credit)
        self._forced_credit -= a
        return [a] * n

    def _draw_forced(self) -> int:
        a, prev = 0, 1.0
        for p in self.forced_curve:
            if self._forced_rng.random() >= p / prev:
                break
            a, prev = a + 1, p
        return a

