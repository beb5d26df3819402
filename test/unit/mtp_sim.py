"""A brute-force simulation of adaptive MTP serving, for the chooser's tests: every step the real
DraftControl picks k from a cost table and its running estimates, each request of the batch
accepts drafts drawn from a per-depth curve (independently, depth by depth), the chooser sees the
verify decisions, and the step is charged its time. The long-run tokens per second per user is
compared against the best fixed k, found by brute force over k = 0..K from the curve and the
charged times.

The cost data below are inputs, copied from the H200 run at 12ae5a9
(benchmark/results/bench_one_batch_mtp_adaptive_nvfp4_inkling-slice.json, NVFP4 experts, public
curve, 66-layer projection): STARTUP_MS is its `step_costs` table (what MTPWorker measured at
start-up and the chooser saw: the bucket of the batch size), TIMED_MS the fixed-k runs'
`extrapolated_66_layers.step_ms` (what those steps took when timed). Milliseconds, k = 0..8.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sgl_inkling.speculative.adaptive import PUBLIC_MTP8_CURVE, AcceptanceTracker, StepCosts
from sgl_inkling.speculative.draft_control import DraftControl

STARTUP_MS = {
    1: [22.416, 41.5073, 46.8801, 52.0433, 57.0133, 61.8533, 66.6757, 70.7543, 76.2384],
    8: [52.6956, 102.8075, 131.1358, 154.2285, 174.6227, 191.2712, 206.3, 219.9478, 228.7403],
    64: [195.9757, 292.1258, 335.1767, 385.864, 459.6052, 492.5008, 542.5402, 592.854, 668.9438],
}
TIMED_MS = {
    1: [20.940, 41.216, 46.709, 52.118, 57.006, 62.002, 66.862, 71.748, 77.278],
    8: [52.333, 102.453, 130.643, 152.183, 173.318, 188.840, 203.915, 215.106, 224.215],
    64: [194.791, 280.909, 317.429, 365.706, 432.361, 465.364, 513.468, 558.763, 624.977],
}
# Batch 8 on the H100 at 0907249 (benchmark/results/diagnostics/mtp_adaptive_h100_0907249/,
# 32K-token draft vocabulary): plain decode is 0.90 of the best k there, k = 3..8 within 3% of it.
H100_B8_STARTUP_MS = [45.713, 77.535, 103.085, 124.535, 141.432, 155.645, 170.079, 180.628, 191.637]
H100_B8_TIMED_MS = [46.918, 79.599, 105.866, 124.438, 142.303, 155.211, 167.642, 177.361, 187.172]
PUBLIC = list(PUBLIC_MTP8_CURVE)  # a_d: the chance that the first d drafts are all accepted


def flat(c: float, depths: int = 8) -> list[float]:
    """The curve of drafts each accepted with chance c whatever the depth: a_d = c ** d."""
    return [c**d for d in range(1, depths + 1)]


def fixed_k_speeds(curve: Sequence[float], times: Sequence[float]) -> list[float]:
    """Tokens per ms per user of every fixed k: a k-draft step emits 1 + a_1 + ... + a_k tokens on
    average (the pending token and the leading accepted drafts)."""
    return [(1 + sum(curve[:k])) / t for k, t in enumerate(times)]


def draw_accepted(curve: Sequence[float], k: int, rng: random.Random) -> int:
    """Leading accepted drafts of one request drafting k: depth d accepts with a_d / a_{d-1}."""
    a, prev = 0, 1.0
    while a < k and rng.random() < curve[a] / prev:
        prev = curve[a]
        a += 1
    return a


def control(seen_ms: Sequence[float], prior: Sequence[float] | None = None) -> DraftControl:
    """A DraftControl as MTPWorker sets it up, adaptive, seeing one cost table for every batch."""
    c = DraftControl()
    c.num_steps = len(seen_ms) - 1
    c._init_draft_control(c.num_steps, adaptive=True)
    c.costs = StepCosts({1: list(seen_ms)})
    c.tracker = AcceptanceTracker(c.num_steps, prior=prior)
    return c


@dataclass
class Run:
    ks: list[int]  # the k of every step
    tokens: list[float]  # tokens per user of every step (sampled)
    ms: list[float]  # the charged time of every step

    def speed(self, start: int = 0, stop: int | None = None) -> float:
        """Sampled tokens per ms per user over steps start..stop."""
        return sum(self.tokens[start:stop]) / sum(self.ms[start:stop])


def simulate(c: DraftControl, curve: Sequence[float] | Callable[[int], Sequence[float]], bs: int,
             times: Sequence[float], steps: int, seed: int = 0) -> Run:  # fmt: skip
    """Serve `steps` steps of a batch of bs requests; curve may be a function of the step index
    (a workload that changes). The chooser sees only the verify decisions, as in serving."""
    rng = random.Random(seed)
    run = Run([], [], [])
    for i in range(steps):
        truth = curve(i) if callable(curve) else curve
        k = c.choose(bs)
        accepted = [draw_accepted(truth, k, rng) for _ in range(bs)]
        if k:  # a plain decode step (k = 0) verifies nothing
            c.observe(accepted, [k] * bs)
        run.ks.append(k)
        run.tokens.append(1 + sum(accepted) / bs)
        run.ms.append(times[k])
    return run
