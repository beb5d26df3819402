"""DraftStep replayed from CUDA graphs, one per batch-size bucket and number of drafting depths (with
tails, lagging.py, also one per k with the depths past k skipping, and one catch-up per first lagging
depth), plus one per bucket for the trunk's rollback (DraftStep.restore_trunk), replayed before the draft
graph after a verify and left out when the depths catch up after plain decode steps (lagging.py).

Padded requests use the runner's reserved row: no drafts wanted (live 0), one kept token, a start
past the tokens depths skip; their KV goes to the padding slot 0 and their conv and carried state
to the reserved row, as in decode graphs. All buckets share one memory pool (captured largest
first): a step's results live in the state pools and `draft_buf`, not in graph outputs. Verified
tokens come padded to K + 1 per request whatever the verify's width (the padding is never real).
With masks=True (a grammar backend is on) every graph masks its first draft with a static xgrammar
bitmask (`static["mask"]`, all ones for unconstrained and padded rows): one set of graphs serves
every grammar, the masks are copied in before the replay. With capture=False nothing is captured
and `run` executes the same step eagerly (the start-up cost measurement on CPU).
"""

from __future__ import annotations

import torch
import xgrammar as xgr

from sgl_inkling.model_executor.cuda_graph_runner import bucket_for, capture_graph, graph_buckets
from sgl_inkling.speculative.draft_step import DraftStep

_PER_REQ = ("rows", "start", "n", "live", "pending", "lag_at")


class DraftGraphRunner:
    def __init__(self, step: DraftStep, max_bs: int, depths=None, pool=None, capture: bool = True,
                 masks: bool = False, tails: bool = False):  # fmt: skip
        self.step = step
        runner = step.runner
        self.buckets = graph_buckets(runner, max_bs)
        self.pad_row = runner.req_to_token.pad_row
        # Columns of verified tokens or, in a catch-up after plain steps, of lagged ones (<= K + 1).
        n, r, dev = self.buckets[-1], step.k + 1, runner.device
        self.static = {f: torch.zeros(n, dtype=torch.int64, device=dev) for f in _PER_REQ}
        self.static["ids"] = torch.zeros(n, r, dtype=torch.int64, device=dev)
        self.static["hidden"] = torch.zeros(n, r, runner.model.cfg.hidden_size, dtype=runner.dtype, device=dev)
        if masks:
            shape = xgr.get_bitmask_shape(n, runner.model.cfg.unpadded_vocab_size)
            self.static["mask"] = torch.full(shape, -1, dtype=xgr.bitmask_dtype, device=dev)
        self._masked_rows = 0  # rows of static["mask"] holding a grammar's mask (reset to all ones when unused)
        self._pad(0, n)
        self.depths = sorted(depths if depths is not None else [step.k], reverse=True)
        # (drafting depths, first depth that skips) per graph: K where none does; with tails, each k
        # between 0 and K also with the depths past it skipping (lagging.py)
        big = step.k
        self.variants = [(k, big) for k in self.depths]
        self.variants += [(k, k) for k in self.depths if tails and 0 < k < big]
        self.catch_up_firsts = [f for f in range(1, big) if tails and f in self.depths]  # tails that catch up
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.catch_up_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.restore_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.eager = not capture
        if not capture:
            return
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            for k, tail in self.variants:
                self.graphs[bs, k, tail], _ = capture_graph(lambda bs=bs, k=k, t=tail: self.run(bs, k, t), self.pool)
            for first in self.catch_up_firsts:
                self.catch_up_graphs[bs, first], _ = capture_graph(lambda bs=bs, f=first: self.run_catch_up(bs, f),
                                                                   self.pool)  # fmt: skip
            self.restore_graphs[bs], _ = capture_graph(lambda bs=bs: self.restore(bs), self.pool)

    @property
    def max_bs(self) -> int:
        return self.buckets[-1]

    def _pad(self, lo: int, hi: int) -> None:
        s = self.static
        s["rows"][lo:hi] = self.pad_row
        s["start"][lo:hi] = self.step.min_start()
        s["n"][lo:hi] = 1
        s["live"][lo:hi] = 0
        s["lag_at"][lo:hi] = 0

    def _host_start(self, bs: int) -> list[int] | None:
        """Eager: the starts on the host, for the reference backend's loops (graphs read none)."""
        return self.static["start"][:bs].tolist() if self.eager else None

    def run(self, bs: int, depths: int, tail: int | None = None) -> None:
        """The step on the static inputs of bucket bs, the trunk's rollback left out (what a graph holds);
        depths tail.. skip it (default: none)."""
        s = self.static
        args = (s[f][:bs] for f in ("rows", "start", "n", "live", "ids", "pending", "hidden"))
        mask = s["mask"][:bs] if "mask" in s else None
        tail = None if tail is None or tail == self.step.k else tail
        self.step.run(*args, host_start=self._host_start(bs), depths=depths, restore_trunk=False, first_mask=mask,
                      tail=tail, lag_at=s["lag_at"][:bs])  # fmt: skip

    def run_catch_up(self, bs: int, first: int) -> None:
        """A tail's catch-up (DraftStep.catch_up_tail) on the static inputs of bucket bs."""
        s = self.static
        self.step.catch_up_tail(s["rows"][:bs], s["start"][:bs], s["n"][:bs], first, host_start=self._host_start(bs))

    def restore(self, bs: int) -> None:
        """The trunk's rollback on the static inputs of bucket bs."""
        self.step.restore_trunk(self.static["rows"][:bs], self.static["n"][:bs])

    def replay_catch_up(self, rows: torch.Tensor, start: torch.Tensor, n: torch.Tensor, first: int) -> None:
        """DraftStep.catch_up_tail's arguments (batch size <= max_bs)."""
        bs = rows.shape[0]
        bucket = bucket_for(self.buckets, bs)
        for f, x in (("rows", rows), ("start", start), ("n", n)):
            self.static[f][:bs].copy_(x)
        if bucket > bs:
            self._pad(bs, bucket)
        self.catch_up_graphs[bucket, first].replay()

    def replay(self, rows, start, n, live, ids, pending, hidden, depths: int, restore_trunk: bool = True,
               first_mask=None, tail: int | None = None, lag_at: torch.Tensor | None = None) -> None:  # fmt: skip
        """Same arguments as DraftStep.run (device tensors, batch size <= max_bs, ids and hidden
        of any verify width <= K + 1; first_mask needs masks=True; tail K or None: no depth skips)."""
        bs = rows.shape[0]
        bucket = bucket_for(self.buckets, bs)
        s = self.static
        tail = self.step.k if tail is None else tail
        if tail < self.step.k:
            s["lag_at"][:bs].copy_(lag_at)
        for f, x in (("rows", rows), ("start", start), ("n", n), ("live", live), ("pending", pending)):
            s[f][:bs].copy_(x)
        r = ids.shape[1]
        s["ids"][:bs, :r].copy_(ids)
        s["hidden"][:bs, :r].copy_(hidden)
        if bucket > bs:
            self._pad(bs, bucket)
        if restore_trunk:
            self.restore_graphs[bucket].replay()
        if callable(first_mask):  # computed on the host while the device rolls the trunk back
            first_mask = first_mask()
        self._load_mask(first_mask)
        self.graphs[bucket, depths, tail].replay()

    def _load_mask(self, mask: torch.Tensor | None) -> None:
        if mask is not None and "mask" not in self.static:
            raise ValueError("a grammar mask for draft graphs captured without masks")
        if mask is not None:
            self.static["mask"][: mask.shape[0]].copy_(mask)
        rows = 0 if mask is None else mask.shape[0]
        if self._masked_rows > rows:  # rows left from an earlier batch's grammars
            self.static["mask"][rows : self._masked_rows].fill_(-1)
        self._masked_rows = rows
