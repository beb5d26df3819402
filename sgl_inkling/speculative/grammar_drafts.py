"""How the ragged chain picks drafts, and grammar-constrained MTP drafting (mixed into MTPWorker):
drafts are the argmax over the draft vocabulary; a constrained request's are picked within its
grammar (the matcher advances tentatively, drafting stops where no draft is legal or the grammar
ends, then rolls back), and its verify rows get the grammar's mask for each position, so
acceptance and logprobs see the masked logits as on the plain path."""

from __future__ import annotations

import torch
import xgrammar as xgr

from sgl_inkling.managers.schedule_batch import Req


class GrammarDrafts:
    """Needs MTPWorker's runner, grammar (the xgrammar backend or None), num_steps and k."""

    def _start_grammars(self, reqs: list[Req]) -> list[Req]:
        """Row 0 of each constrained request's verify masks is its grammar's state now; every request
        gets self.k drafts."""
        out = []
        for req in reqs:
            req.draft_masks, req.draft_tentative, req.draft_open = None, 0, False
            req.draft_limit = req.draft_count = self.k
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
            req = reqs[idx[k]]
            g = req.grammar
            if g.accept_many([toks[k]]) != 1:
                req.draft_open = False  # no legal token (cannot happen after the mask): cap here
                continue
            req.draft_tentative += 1
            req.draft_limit = depth + 1
            if g.terminated:
                req.draft_open = False  # the request ends with this draft if it is accepted
            else:
                g.fill(req.draft_masks, depth + 1)
        return toks

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
