"""Exploration for the adaptive draft length: now and then a step drafts deeper than the chooser's
k to get evidence on the depths past it, at a cost kept within EXPLORE_LOSS of the tokens.

Only drafted depths are judged, so without exploration a depth the chooser stopped drafting (after
an unlucky run of rejections, or once the workload changed) would keep its estimate for good, and
a batch that fell back to plain decode (k = 0) would learn nothing at all.

The cost is counted in what the chooser maximises: under the current estimates a step that drafts
k' instead of k gives up (speed at k - speed at k') x (time of a k' step) expected tokens, its
expected loss. The budget earns EXPLORE_LOSS of every step's expected tokens and spends it on an
exploration step as soon as it holds that step's loss, so the cumulative expected loss stays
within EXPLORE_LOSS of the cumulative expected tokens and exploring is as frequent as it is cheap:
at any step where the deeper k is about as fast as the chosen one, every 35th to 80th where plain
decode is chosen and the first draft nearly doubles a step (batch 1 on the H200). Credit is not
saved beyond one exploration, so a long stretch with nothing to explore is not followed by a burst.

Which deeper k': a draft is judged only when the drafts before it were accepted, so drafting far
past a depth with little evidence mostly costs verify tokens that are never judged. The candidates
run to one depth past the deepest leading depth that rests more on evidence than on its prior
(AcceptanceTracker.judged). Each is scored by its speed with the depths past k at their optimistic
rates (one standard error up, AcceptanceTracker.optimistic) and depths 1..k at their estimates
(the chosen step judges those anyway); the best of those that would beat the chosen k is the
evidence most likely to change the choice. If none would, a drafting k explores nothing (even
optimistic evidence could not change it: at batch 1 on the H200, k = 8 never beats k = 7 there,
whatever depth 8 does), but plain decode, which judges nothing, still explores the cheapest, so
that evidence trickles in should drafts that were useless become good.
"""

from __future__ import annotations

from collections.abc import Sequence

from sgl_inkling.speculative.adaptive import AcceptanceTracker, expected_tokens

EXPLORE_LOSS = 0.01  # the most of the expected tokens that exploring may cost


def exploration_target(rates: Sequence[float], hopes: Sequence[float], step_cost: Sequence[float], k: int,
                       judged: int) -> tuple[int, float] | None:  # fmt: skip
    """The k' > k worth drafting instead of k for evidence and its expected loss in tokens per
    request, or None (k is the deepest, or no evidence could change a drafting k). rates: the
    estimates, hopes: the optimistic rates, judged: the leading depths with evidence (see the
    module note)."""
    if k + 1 >= len(step_cost):
        return None
    speed = expected_tokens(rates, k) / step_cost[k]
    deeper = range(k + 1, min(len(step_cost), max(judged + 2, k + 2)))
    # Optimism only past k: the chosen step judges depths 1..k anyway.
    mixed = [*rates[:k], *hopes[k:]]
    hoped = {j: expected_tokens(mixed, j) / step_cost[j] for j in deeper}
    reach = [j for j in deeper if hoped[j] > speed]
    if reach:
        target = max(reach, key=lambda j: (hoped[j], j))
    elif k == 0:
        target = max(deeper, key=lambda j: (expected_tokens(rates, j) / step_cost[j], j))
    else:
        return None
    return target, max(speed * step_cost[target] - expected_tokens(rates, target), 0.0)


class ExplorationBudget:
    """The credit of expected tokens that exploring may still spend (see the module note)."""

    def __init__(self) -> None:
        self.credit = 0.0
        self.spent = 0.0  # expected tokens given up so far
        self.earned = 0.0  # EXPLORE_LOSS x the expected tokens of the chosen steps so far

    def pick(self, tracker: AcceptanceTracker, rates: Sequence[float], step_cost: Sequence[float], k: int) -> int:
        """The step's number of drafts: k as chosen from rates, or a deeper one to explore."""
        earn = EXPLORE_LOSS * expected_tokens(rates, k)
        self.credit += earn
        self.earned += earn
        probe = exploration_target(rates, tracker.optimistic(), step_cost, k, tracker.judged())
        if probe is None:
            return k
        target, loss = probe
        self.credit = min(self.credit, loss)  # never saved beyond one exploration
        if self.credit < loss:
            return k
        self.credit -= loss
        self.spent += loss
        return target
