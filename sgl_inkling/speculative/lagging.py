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
"""

from __future__ import annotations

import torch

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.sampling.host_copy import to_device


class LaggingDepths:
    """Needs MTPWorker's runner, num_steps, step, draft_graphs, fixed_shapes, draft, _first_masks, _walk_drafts."""

    def _init_lagging(self, rows: int, hidden_size: int) -> None:
        dev = self.runner.device
        self.lag_ids = torch.zeros(rows, self.num_steps + 1, dtype=torch.int64, device=dev)
        self.lag_hidden = torch.zeros(rows, self.num_steps + 1, hidden_size, device=dev)  # fp32, as the carry
        self.num_plain_steps = 0
        self.num_catch_ups = 0

    @property
    def lag_capacity(self) -> int:
        return self.num_steps + 1

    def record_plain(self, reqs: list[Req], tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        """After a plain decode step where each request's trunk consumed tokens[i] (its pending
        token; output hidden[i]): keep both for the depths. Every request must have room."""
        if any(q.depth_lag >= self.lag_capacity for q in reqs):
            raise RuntimeError("a request lagged past the depths' buffers: catch it up before the step")
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
        from their pending one (self.k becomes k, each one's draft_count too)."""
        self.k = k
        if not reqs:
            return
        self.num_catch_ups += 1
        lags = [q.depth_lag for q in reqs]
        starts = [q.kv_len - n for q, n in zip(reqs, lags)]
        if min(lags) >= 1 and self._draft_step_covers(reqs, starts):
            rows = to_device([q.row for q in reqs], torch.int64, self.runner.device)
            live = [0 if q.finished else 1 for q in reqs]
            pending = [0 if q.finished else q.fill_ids[q.kv_len] for q in reqs]
            self.catch_up_rows(rows, starts, lags, live, pending, k, first_mask=lambda: self._first_masks(reqs))
            self._walk_drafts(reqs, rows)  # grammar-constrained requests: their drafts' legal prefix
        else:  # the ragged chain: short prompts, requests with nothing lagged
            self.draft(reqs, starts, [self.lag_hidden[q.row, :n] for q, n in zip(reqs, lags)])
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
            self.lag_ids[rows],
            to_device(pending, torch.int64, dev),
            self.lag_hidden[rows],
        )
        self.num_fixed_shape_steps += 1
        if self.draft_graphs is not None and rows.shape[0] <= self.draft_graphs.max_bs:
            self.draft_graphs.replay(*args, depths=k, restore_trunk=False, first_mask=first_mask)
        else:
            self.step.run(*args, host_start=starts, depths=k, restore_trunk=False, first_mask=first_mask)
