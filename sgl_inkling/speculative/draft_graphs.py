"""DraftStep replayed from CUDA graphs, one per batch-size bucket and number of drafting depths,
plus one per bucket for the trunk's rollback (DraftStep.restore_trunk), replayed before the draft
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

from sgl_inkling.model_executor.cuda_graph_runner import bucket_for, buckets_up_to, capture_graph
from sgl_inkling.speculative.draft_step import DraftStep

_PER_REQ = ("rows", "start", "n", "live", "pending")


class DraftGraphRunner:
    def __init__(self, step: DraftStep, max_bs: int, depths=None, pool=None, capture: bool = True,
                 masks: bool = False):  # fmt: skip
        self.step = step
        runner = step.runner
        self.buckets = buckets_up_to(max_bs)
        self.pad_row = runner.req_to_token.pad_row
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
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.restore_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.eager = not capture
        if not capture:
            return
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            for k in self.depths:
                self.graphs[bs, k], _ = capture_graph(lambda bs=bs, k=k: self.run(bs, k), self.pool)
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

    def run(self, bs: int, depths: int) -> None:
        """The step on the static inputs of bucket bs, the trunk's rollback left out (what a graph holds)."""
        s = self.static
        host = [self.step.min_start()] * bs if self.eager else None  # for the reference backend's loops
        args = (s[f][:bs] for f in ("rows", "start", "n", "live", "ids", "pending", "hidden"))
        mask = s["mask"][:bs] if "mask" in s else None
        self.step.run(*args, host_start=host, depths=depths, restore_trunk=False, first_mask=mask)

    def restore(self, bs: int) -> None:
        """The trunk's rollback on the static inputs of bucket bs."""
        self.step.restore_trunk(self.static["rows"][:bs], self.static["n"][:bs])

    def replay(self, rows, start, n, live, ids, pending, hidden, depths: int, restore_trunk: bool = True,
               first_mask=None) -> None:  # fmt: skip
        """Same arguments as DraftStep.run (device tensors, batch size <= max_bs, ids and hidden
        of any verify width <= K + 1; first_mask needs masks=True)."""
        bs = rows.shape[0]
        bucket = bucket_for(self.buckets, bs)
        s = self.static
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
        self.graphs[bucket, depths].replay()

    def _load_mask(self, mask: torch.Tensor | None) -> None:
        if mask is not None and "mask" not in self.static:
            raise ValueError("a grammar mask for draft graphs captured without masks")
        if mask is not None:
            self.static["mask"][: mask.shape[0]].copy_(mask)
        rows = 0 if mask is None else mask.shape[0]
        if self._masked_rows > rows:  # rows left from an earlier batch's grammars
            self.static["mask"][rows : self._masked_rows].fill_(-1)
        self._masked_rows = rows
