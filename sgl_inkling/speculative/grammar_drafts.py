"""Grammar-constrained MTP drafting (mixed into MTPWorker), and how the ragged chain picks drafts.

Drafts are the argmax over the draft vocabulary. A constrained request's drafts are walked through
its grammar (the matcher advances tentatively, then rolls back): its `draft_limit` stops where a
draft is illegal or the grammar ends, and its verify rows get the grammar's mask for each
position, so acceptance and logprobs see the masked logits as on the plain path.
- The ragged chain (DepthChain) picks every depth's draft within the grammar (`_pick`), a host
  round trip per depth.
- The fixed-shape step (DraftStep, CUDA graphs) masks only the first draft, with the mask of the
  grammar's state now (`_first_masks`); deeper drafts are unconstrained, and after the step the
  host reads them once and keeps the longest legal prefix (`_walk_drafts`)."""

from __future__ import annotations

import torch
import xgrammar as xgr

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.sampling.host_copy import to_device


class GrammarDrafts:
    """Needs MTPWorker's runner, grammar (the xgrammar backend or None), num_steps and draft_buf."""

    def _start_grammars(self, reqs: list[Req], k: int) -> list[Req]:
        """Row 0 of each constrained request's verify masks is its grammar's state now; every request
        gets k drafts."""
        out = []
        for req in reqs:
            req.draft_masks, req.draft_tentative, req.draft_open = None, 0, False
            req.draft_limit = req.draft_count = k
            g = req.grammar
            if req.finished or g is None or not g.active:
                continue
            req.draft_masks = xgr.allocate_token_bitmask(self.num_steps + 1, self.grammar.masker.vocab_size)
            g.fill(req.draft_masks, 0)
            req.draft_limit, req.draft_open = 0, True  # the cap rises as drafts pass the grammar
            out.append(req)
        return out

    def _pick(self, reqs: list[Req], depth: int, idx: list[int], logits: torch.Tensor) -> list[int]:
        """Depth `depth`'s drafts: the argmax, within the grammar when the request has one."""
        logits = logits.float()
        vocab = self.runner.model.draft_vocab
        if vocab is not None:  # draft logits cover the token map only: the rest cannot be drafted
            full = logits.new_full((logits.shape[0], self.runner.model.cfg.unpadded_vocab_size), float("-inf"))
            logits = full.index_copy_(1, vocab, logits)
        masked = [k for k, i in enumerate(idx) if reqs[i].draft_open]
        if masked:
            rows = torch.cat([reqs[idx[k]].draft_masks[depth : depth + 1] for k in masked])
            full = torch.full((len(idx), rows.shape[1]), -1, dtype=rows.dtype)
            full[masked] = rows
            self.grammar.masker._apply_kernel(logits, full.to(logits.device), masked)
        toks = logits.argmax(-1).tolist()
        for k in masked:
            self._advance(reqs[idx[k]], depth, toks[k])
        return toks

    @staticmethod
    def _advance(req: Req, depth: int, tok: int) -> None:
        """Draft depth + 1 of an open constrained request is `tok`: advance its grammar tentatively
        and raise its cap, or close it where the draft is illegal or the grammar ends."""
        g = req.grammar
        if g.accept_many([tok]) != 1:
            req.draft_open = False  # illegal: no draft from here on can be accepted
            return
        req.draft_tentative += 1
        req.draft_limit = depth + 1
        if g.terminated:
            req.draft_open = False  # the request ends with this draft if it is accepted
        else:
            g.fill(req.draft_masks, depth + 1)

    def _first_masks(self, reqs: list[Req], k: int) -> torch.Tensor | None:
        """Start the step's grammars (_start_grammars) and give DraftStep the bitmask of every
        request's first draft on the device [B, ceil(V / 32)] (all ones where unconstrained);
        None when no request is constrained."""
        if not self._start_grammars(reqs, k):
            return None
        idx = [i for i, q in enumerate(reqs) if q.draft_open]
        first = torch.stack([reqs[i].draft_masks[0] for i in idx])
        full = first.new_full((len(reqs), first.shape[1]), -1)
        full[idx] = first
        return to_device(full, full.dtype, self.runner.device)

    def _walk_drafts(self, reqs: list[Req], rows: torch.Tensor, k: int) -> None:
        """After DraftStep drafted k tokens for request rows `rows` (device): read the constrained
        requests' drafts (one read), cap each at its longest legal prefix and fill its verify masks,
        then roll the grammars back."""
        idx = [i for i, q in enumerate(reqs) if q.draft_open]
        if not idx:
            return
        if k:
            sel = rows[to_device(idx, torch.int64, rows.device)] if len(idx) < len(reqs) else rows
            for i, drafts in zip(idx, self.draft_buf[sel, :k].tolist()):
                for depth, tok in enumerate(drafts):
                    if not reqs[i].draft_open:
                        break
                    self._advance(reqs[i], depth, tok)
        for i in idx:
            reqs[i].grammar.rollback(reqs[i].draft_tentative)
            reqs[i].draft_tentative, reqs[i].draft_open = 0, False

    def verify_masks(self, reqs: list[Req], logits: torch.Tensor) -> bool:
        """Apply each constrained request's per-row masks to its verify logits [B, k + 1, V];
        whether there were any."""
        if self.grammar is None:
            return False
        r = logits.shape[1]
        rows, parts = [], []
        for i, req in enumerate(reqs):
            if req.draft_masks is None:
                continue
            n = min(req.draft_limit, r - 1) + 1
            rows.extend(i * r + j for j in range(n))
            parts.append(req.draft_masks[:n])
        if not rows:
            return False
        flat = logits.view(-1, logits.shape[-1])
        full = torch.full((flat.shape[0], parts[0].shape[1]), -1, dtype=parts[0].dtype)
        full[rows] = torch.cat(parts)
        self.grammar.masker._apply_kernel(flat, full.to(flat.device), rows)
        return True
