"""Plain decode steps under MTP (k = 0) and how the depths catch up after them (mixed into MTPWorker).

When the chooser picks no drafts, the step is the plain decode step (the decode CUDA graph of its
bucket, no verify, no drafting): only the trunk consumes the pending token. The depths fall
behind, and what they need to consume the token later is kept per request row: the token
(`lag_ids`) and the trunk's final-normed hidden for it (`lag_hidden`, the depth-0 input for the
next token); `req.depth_lag` counts them. The depths catch up in one pass over all lagged tokens
(the draft step with the lagged tokens standing for a verify's kept ones, the trunk not rolled
back), in these cases:
- a later step picks k > 0: the catch-up also drafts k tokens from the pending one, so the next
  step verifies them (the transition costs one draft step, as a speculative step's drafting does);
- a request has lagged K + 1 tokens (the buffers' width): a non-drafting catch-up;
- before the radix tree caches a request's state (finish, retraction): a checkpoint covers every
  level, so the depths must hold every token the trunk holds.
While a request lags its own sliding KV is not released: the depths still read the window of the
lagged tokens.

Depths past a step's drafting ones lag the same way (`tail`: req.lag_from = k > 0). At batch 1 a
depth costs a whole dense layer's weights (0.6 ms on the H100 at fd1a113) whether it drafts or
only consumes the kept tokens, so a step with k drafts runs depths 0..k-1 and the others skip it;
their inputs (the kept tokens and depth k - 1's outputs for them) go to the same buffers, up to
C = 2K + 1 tokens (what the depths' conv windows hold). They catch up in one non-drafting pass
(DraftStep.catch_up_tail, one weight read for up to C tokens) when a step would overflow C, when the
next step's k differs from theirs, before a plain step, and before the radix tree caches the request.
"""

from __future__ import annotations

import torch

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.sampling.host_copy import to_device


class LaggingDepths:
    """Needs MTPWorker's runner, num_steps, step, draft_graphs, fixed_shapes, draft, _first_masks, _walk_drafts."""

    def _init_lagging(self, rows: int, hidden_size: int) -> None:
        dev, width = self.runner.device, self.tail_capacity + 1  # column C: writes past a row's kept tokens
        self.lag_ids = torch.zeros(rows, width, dtype=torch.int64, device=dev)
        self.lag_hidden = torch.zeros(rows, width, hidden_size, device=dev)  # fp32, as the carry
        self.num_plain_steps = 0
        self.num_catch_ups = 0
        self.num_tail_catch_ups = 0
        # Depths past the drafting ones skip speculative steps (fixed-shape steps only; off: every
        # depth runs every step, as before the tails, for comparisons).
        self.tail_lag = True

    @property
    def lag_capacity(self) -> int:
        """Tokens all depths may lag (plain steps): a catch-up that drafts takes at most K + 1."""
        return self.num_steps + 1

    @property
    def tail_capacity(self) -> int:
        """Tokens depths past the drafting ones may lag: C = 2K + 1, what their conv windows hold."""
        return 2 * self.num_steps + 1

    def record_plain(self, reqs: list[Req], tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        """After a plain decode step where each request's trunk consumed tokens[i] (its pending
        token; output hidden[i]): keep both for the depths. Every request must have room."""
        if any(q.depth_lag >= self.lag_capacity or (q.depth_lag and q.lag_from) for q in reqs):
            raise RuntimeError("a request lagged past the depths' buffers, or its tail lags: catch it up first")
        dev = self.runner.device
        rows = to_device([q.row for q in reqs], torch.int64, dev)
        cols = to_device([q.depth_lag for q in reqs], torch.int64, dev)
        self.lag_ids[rows, cols] = tokens
        self.lag_hidden[rows, cols] = hidden.float()
        for q in reqs:
            q.depth_lag += 1
        self.num_plain_steps += 1

    def catch_up(self, reqs: list[Req], k: int) -> None:
        """The depths consume each request's lagged tokens; the unfinished ones then draft k tokens
        from their pending one (each one's draft_count becomes k). A drafting catch-up (k > 0, after
        a plain step) sets the batch's next step to k; a non-drafting one (a full lag buffer, a
        request leaving) leaves it as the chooser picked: a leaving request's catch-up set it to 0,
        and the next step ran plain decode over the others, whose tails it cannot take."""
        if k:
            self.k = k
        self._consume_lag(reqs, k)

    def _consume_lag(self, reqs: list[Req], k: int) -> None:
        tails = [q for q in reqs if q.depth_lag and q.lag_from]
        if tails:
            if k:
                raise RuntimeError("a tail's catch-up drafts nothing")
            self.catch_up_tails(tails)
            reqs = [q for q in reqs if q not in tails]
        if not reqs:
            return
        self.num_catch_ups += 1
        lags = [q.depth_lag for q in reqs]
        starts = [q.kv_len - n for q, n in zip(reqs, lags)]
        if min(lags) >= 1 and self._draft_step_covers(reqs, starts):
            rows = to_device([q.row for q in reqs], torch.int64, self.runner.device)
            live = [0 if q.finished else 1 for q in reqs]
            pending = [0 if q.finished else q.fill_ids[q.kv_len] for q in reqs]
            self.catch_up_rows(rows, starts, lags, live, pending, k, first_mask=lambda: self._first_masks(reqs, k))
            self._walk_drafts(reqs, rows, k)  # grammar-constrained requests: their drafts' legal prefix
        else:  # the ragged chain: short prompts, requests with nothing lagged
            self.draft(reqs, starts, [self.lag_hidden[q.row, :n] for q, n in zip(reqs, lags)], k)
        for q in reqs:
            q.depth_lag = 0

    def catch_up_rows(self, rows: torch.Tensor, starts: list[int], lags: list[int], live: list[int],
                      pending: list[int], k: int, first_mask=None) -> None:  # fmt: skip
        """The fixed-shape catch-up (DraftStep, from its graphs when captured) of request rows whose
        depths committed `starts[i]` tokens and lag `lags[i]` >= 1 (the benchmark calls it too);
        first_mask as DraftStep.run's."""
        dev = self.runner.device
        args = (
            rows,
            to_device(starts, torch.int64, dev),
            to_device(lags, torch.int64, dev),
            to_device(live, torch.int64, dev),
            self.lag_ids[rows, : self.lag_capacity],
            to_device(pending, torch.int64, dev),
            self.lag_hidden[rows, : self.lag_capacity],
        )
        self.num_fixed_shape_steps += 1
        if self.draft_graphs is not None and rows.shape[0] <= self.draft_graphs.max_bs:
            self.draft_graphs.replay(*args, depths=k, restore_trunk=False, first_mask=first_mask)
        else:
            self.step.run(*args, host_start=starts, depths=k, restore_trunk=False, first_mask=first_mask)

    def catch_up_tails(self, reqs: list[Req], ends: list[int] | None = None) -> None:
        """Depths lag_from.. of each request consume the tokens they lag (nothing drafts), which end at
        ends[i] (default: its committed length)."""
        dev = self.runner.device
        ends = ends or [q.kv_len for q in reqs]
        for first in sorted({q.lag_from for q in reqs if q.depth_lag}):
            group = [(q, e) for q, e in zip(reqs, ends) if q.depth_lag and q.lag_from == first]
            self.catch_up_tail_rows(to_device([q.row for q, _ in group], torch.int64, dev),
                                    [e - q.depth_lag for q, e in group], [q.depth_lag for q, _ in group], first)  # fmt: skip
            for q, _ in group:
                q.depth_lag = q.lag_from = 0

    def catch_up_tail_rows(self, rows: torch.Tensor, starts: list[int], lags: list[int], first: int) -> None:
        """DraftStep.catch_up_tail for request rows whose depths first.. committed starts[i] tokens and
        lag lags[i] (from its graphs when captured; the benchmark calls it too)."""
        dev = self.runner.device
        self.num_tail_catch_ups += 1
        start, n = to_device(starts, torch.int64, dev), to_device(lags, torch.int64, dev)
        if self.draft_graphs is not None and rows.shape[0] <= self.draft_graphs.max_bs:
            self.draft_graphs.replay_catch_up(rows, start, n, first)
        else:
            self.step.catch_up_tail(rows, start, n, first, host_start=starts)

    def draft_fixed(self, rows: torch.Tensor, starts: list[int], kept: list[int], live: list[int], ids: torch.Tensor,
                    pending: list[int], hidden: torch.Tensor, k: int, lags: list[int], froms: list[int],
                    first_mask=None, restore_trunk: bool = True) -> tuple[list[int], list[int]]:  # fmt: skip
        """The fixed-shape draft step after a verify (DraftStep.run's arguments, host lists where they
        are counts) drafting k, with the tails: depths past k skip it where tails are on; a request's
        lagging depths catch up first when they are not the ones skipping now or the kept tokens
        would overflow their buffer. lags / froms: each request's depth_lag / lag_from before the
        step; returns them after it."""
        dev, big = self.runner.device, self.num_steps
        tail = k if self.tail_lag and 0 < k < big else big
        due = [i for i, (lag, f, n) in enumerate(zip(lags, froms, kept))
               if lag and (f != tail or lag + n > self.tail_capacity)]  # fmt: skip
        for first in sorted({froms[i] for i in due}):
            group = [i for i in due if froms[i] == first]
            idx = to_device(group, torch.int64, dev) if len(group) < len(lags) else slice(None)
            self.catch_up_tail_rows(rows[idx], [starts[i] - lags[i] for i in group], [lags[i] for i in group], first)
        lags = [0 if i in due else lag for i, lag in enumerate(lags)]
        args = (rows, to_device(starts, torch.int64, dev), to_device(kept, torch.int64, dev),
                to_device(live, torch.int64, dev), ids, to_device(pending, torch.int64, dev), hidden)  # fmt: skip
        lag_at = to_device(lags, torch.int64, dev) if tail < big else None
        self.num_fixed_shape_steps += 1
        if self.draft_graphs is not None and rows.shape[0] <= self.draft_graphs.max_bs:
            self.draft_graphs.replay(*args, depths=k, restore_trunk=restore_trunk, first_mask=first_mask,
                                     tail=tail, lag_at=lag_at)  # fmt: skip
        else:
            self.step.run(*args, host_start=starts, depths=k, restore_trunk=restore_trunk, first_mask=first_mask,
                          tail=None if tail == big else tail, lag_at=lag_at)  # fmt: skip
        if tail == big:
            return [0] * len(lags), [0] * len(lags)
        return [lag + n for lag, n in zip(lags, kept)], [tail] * len(lags)
