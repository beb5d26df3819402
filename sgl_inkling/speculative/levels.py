"""Token-aligned execution of the MTP depths.

Every level of the model *consumes tokens*. The trunk consumes token t at position t. MTP depth d
consumes token t at position t - d - 1, pairing it with the output of the level below for token
t - 1 (depth d - 1's, or the trunk's for d = 0): that is the chain of INKLING.md section 3, written
so that the state of every level after consuming tokens [0, c) depends on those tokens only.

Consequences the runtime relies on:
- A level writes the KV of token t into token t's slot (depth d reads the req-to-token tables
  shifted by d + 1), so a slot owned by the radix tree never holds anything a later token decided.
- "Committed up to c" means the same for every level: KV, conv state and the carried hidden (the
  lower level's output for token c - 1, the next depth input) are functions of tokens [0, c). A
  prefix-cache checkpoint at c therefore covers the trunk and all depths, and a request resumed at
  c continues every level exactly.
- Drafting consumes the pending token and earlier drafts speculatively; the conv window captured
  during the forward restores each depth to its committed point afterwards, and the KV written for
  speculative tokens sits in slots the request owns, overwritten when those tokens are consumed
  for real.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.model_executor.model_runner import ModelRunner


@dataclass
class LevelSeq:
    """One sequence's tokens for the levels of one step.

    Tokens [start, start + len(tokens)) are consumed; those below `commit` are real and become the
    committed state, the rest are speculative (the pending token and drafts).
    """

    row: int
    start: int
    tokens: list[int]
    commit: int
    trunk_hidden: torch.Tensor  # [n, H] trunk output for tokens [start, start + n) consumed this step
    snapshots: list[tuple[int, int]] = field(default_factory=list)  # (token count, checkpoint slot)
    want_drafts: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class DepthChain:
    """Runs depths 0..D-1 over LevelSeqs, chaining drafts when sequences want them."""

    def __init__(self, runner: ModelRunner, num_depths: int, carry: torch.Tensor, capture: dict):
        self.runner = runner
        self.num_depths = num_depths
        self.carry = carry  # [rows, D, H] fp32: carry[row, d] = input of depth d for the next token
        self.capture = capture  # depth layer id -> conv window buffers [rows, K-1 + n, C] per stream
        self.trunk_layers = runner.model.cfg.num_hidden_layers

    def run(
        self,
        seqs: list[LevelSeq],
        pick_drafts: Callable[[int, list[int], torch.Tensor], list[int]] | None = None,
        ckpts=None,
        num_drafts: int | None = None,
    ) -> list[list[int]]:
        """Consume every sequence's tokens at every depth; returns the drafts per sequence.

        pick_drafts(depth, seq_indices, logits) chooses depth d's drafts (each the token after the
        sequence's last consumed one) for the sequences that want drafts; each is appended to its
        sequence's tokens for the next depth. `ckpts` (an SConvCheckpointPool) receives the
        snapshots the sequences ask for. Only depths below `num_drafts` (default: all) draft; the
        others consume the committed tokens only, so they stay current for later steps.
        """
        num_drafts = self.num_depths if num_drafts is None else num_drafts
        drafts: list[list[int]] = [[] for _ in seqs]
        tokens = [list(s.tokens) for s in seqs]
        below: list[tuple[int, torch.Tensor]] = [(s.start, s.trunk_hidden) for s in seqs]
        updates: list[tuple[int, int, torch.Tensor]] = []  # carries change only after every depth ran
        for s in seqs:
            self._carry(updates, ckpts, s, 0, s.start, s.trunk_hidden)
        for d in range(self.num_depths):
            layer = self.trunk_layers + d
            kept, inputs, toks, prefix, full, swa, counts, snaps = [], [], [], [], [], [], [], {}
            drafting = d < num_drafts
            for i, s in enumerate(seqs):
                end = s.start + len(tokens[i]) if drafting else min(s.start + len(tokens[i]), s.commit)
                first = max(s.start, d + 1)  # depth d never consumes tokens 0..d
                if end <= first:
                    self._copy_live_to_snapshots(ckpts, s, layer)
                    if d + 1 < self.num_depths:
                        self._carry(updates, ckpts, s, d + 1, end, s.trunk_hidden[:0])
                    below[i] = (end, s.trunk_hidden[:0])
                    continue
                inputs.append(self._inputs(s, d, first, end, below[i]))
                kept.append(i)
                toks.append(tokens[i][first - s.start : end - s.start])
                prefix.append(first - d - 1)
                full.append(self.runner.req_to_token.read("full", s.row, first, end))
                swa.append(self.runner.req_to_token.read("swa", s.row, first, end))
                counts.append(1 if s.want_drafts and drafting else 0)
                if s.snapshots:
                    snaps[len(kept) - 1] = [(min(max(p - first, 0), end - first), slot) for p, slot in s.snapshots]
            if not kept:
                continue
            fb = ForwardBatch.build(
                ForwardMode.EXTEND,
                toks,
                [seqs[i].row for i in kept],
                prefix,
                torch.cat(full).tolist(),
                torch.cat(swa).tolist(),
                self.runner.device,
                logits_counts=counts,
            )
            fb.table_offset = d + 1
            if snaps:
                fb.sconv_snapshots, fb.sconv_checkpoints = snaps, ckpts
            speculative = any(seqs[i].commit < prefix[k] + d + 1 + len(toks[k]) for k, i in enumerate(kept))
            if speculative:
                fb.sconv_capture = {layer: self.capture[layer]}
            out = self.runner.forward_mtp(d, torch.cat(inputs).to(self.runner.dtype), fb)
            offset = 0
            for k, i in enumerate(kept):
                s, n = seqs[i], len(toks[k])
                first = max(s.start, d + 1)
                rows = out.hidden[offset : offset + n]
                offset += n
                below[i] = (first, rows)
                if speculative:
                    self._restore(layer, s.row, min(max(s.commit - first, 0), n))
                if d + 1 < self.num_depths:
                    self._carry(updates, ckpts, s, d + 1, first, rows)
            wanting = [i for i in kept if seqs[i].want_drafts and drafting]
            if wanting:
                assert pick_drafts is not None
                for i, tok in zip(wanting, pick_drafts(d, wanting, out.logits)):
                    drafts[i].append(tok)
                    tokens[i].append(tok)
        for row, d, h in updates:
            self.carry[row, d] = h.float()
        return drafts

    def _inputs(self, s: LevelSeq, d: int, first: int, end: int, below: tuple[int, torch.Tensor]) -> torch.Tensor:
        """The lower level's outputs for tokens [first - 1, end - 1) in fp32; the carry stands in
        for token first - 1 when the lower level did not consume it in this step."""
        b_first, b_rows = below
        lo, parts = first - 1, []
        if lo < b_first:
            parts.append(self.carry[s.row, d : d + 1])
            lo += 1
        parts.append(b_rows[lo - b_first : end - 1 - b_first].float())
        return torch.cat(parts)

    def _carry(self, updates: list, ckpts, s: LevelSeq, d: int, first: int, rows: torch.Tensor) -> None:
        """carry[d] at a token count c is the lower level's output for token c - 1: record it for
        the commit point and for the requested snapshots (the live carry when not reached here)."""
        t = s.commit - 1
        if first <= t < first + rows.shape[0]:
            updates.append((s.row, d, rows[t - first]))
        if ckpts is None or not s.snapshots:
            return
        buf = ckpts.store["mtp_carry"][0]
        for p, slot in s.snapshots:
            t = p - 1
            buf[slot, d] = rows[t - first].float() if first <= t < first + rows.shape[0] else self.carry[s.row, d]

    def _copy_live_to_snapshots(self, ckpts, s: LevelSeq, layer: int) -> None:
        """A depth that consumed nothing this step already is at every snapshot point."""
        if ckpts is None:
            return
        live = self.runner.sconv_pool.states[layer]
        for _, slot in s.snapshots:
            for dst, src in zip(ckpts.store[layer], live):
                dst[slot] = src[s.row]

    def _restore(self, layer: int, row: int, j: int) -> None:
        """Conv state after the first j tokens this depth consumed in this step (its commit point)."""
        width = self.runner.sconv_pool.width
        for state, cap in zip(self.runner.sconv_pool.states[layer], self.capture[layer]):
            state[row] = cap[row, j : j + width]
