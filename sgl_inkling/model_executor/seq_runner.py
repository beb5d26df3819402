"""Sequences over a ModelRunner without a scheduler: slot bookkeeping for offline loops and tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.models.inkling.model import ModelOutput


@dataclass
class Seq:
    row: int  # req-to-token row and short-conv state slot
    tokens: list[int] = field(default_factory=list)  # tokens whose KV is in the caches
    full_slots: list[torch.Tensor] = field(default_factory=list)
    swa_slots: list[torch.Tensor] = field(default_factory=list)


class SeqRunner:
    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def new_seq(self) -> Seq:
        row = self.runner.req_to_token.alloc()
        if row is None:
            raise RuntimeError("no free request slot")
        return Seq(row=row)

    def free(self, seq: Seq) -> None:
        for slots, pool in ((seq.full_slots, self.runner.full_pool), (seq.swa_slots, self.runner.swa_pool)):
            for s in slots:
                pool.allocator.free(s)
            slots.clear()
        self.runner.req_to_token.free(seq.row)

    def _alloc(self, seq: Seq, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.runner
        full, swa = r.full_pool.allocator.alloc(n), r.swa_pool.allocator.alloc(n)
        if full is None or swa is None:
            raise RuntimeError("KV pool exhausted")
        start = len(seq.tokens)
        r.req_to_token.write("full", seq.row, start, full)
        r.req_to_token.write("swa", seq.row, start, swa)
        seq.full_slots.append(full)
        seq.swa_slots.append(swa)
        return full, swa

    def step(
        self,
        seqs: list[Seq],
        new_tokens: list[list[int]],
        all_logits: bool = False,
        input_embeds: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Run the new tokens of every sequence in one batch (decode when each brings exactly one).
        `input_embeds` [T, H], if given, replaces the token embeddings (media prompts)."""
        mode = (
            ForwardMode.DECODE
            if all(len(t) == 1 for t in new_tokens) and not all_logits
            else ForwardMode.EXTEND
        )
        prefix_lens = [len(s.tokens) for s in seqs]
        locs = [self._alloc(s, len(t)) for s, t in zip(seqs, new_tokens)]
        batch = ForwardBatch.build(
            mode,
            new_tokens,
            [s.row for s in seqs],
            prefix_lens,
            torch.cat([f for f, _ in locs]).tolist(),
            torch.cat([w for _, w in locs]).tolist(),
            self.runner.device,
            all_logits=all_logits,
        )
        batch.input_embeds = input_embeds
        out = self.runner.forward(batch)
        for s, t in zip(seqs, new_tokens):
            s.tokens.extend(t)
        return out

    def greedy(self, prompt: list[int], max_new_tokens: int, stop_ids: set[int] | None = None) -> list[int]:
        """A plain greedy loop: prefill, then one decode step per token."""
        seq = self.new_seq()
        try:
            out = self.step([seq], [prompt])
            generated: list[int] = []
            while True:
                tok = int(out.logits[-1].argmax())
                generated.append(tok)
                if len(generated) >= max_new_tokens or (stop_ids and tok in stop_ids):
                    return generated
                out = self.step([seq], [[tok]])
        finally:
            self.free(seq)
