"""Test-only drafts that are right at a controlled, depth-dependent rate.

DraftOracle wraps an MTPWorker's draft picking (the DepthChain path): knowing each request's greedy
continuation (computed beforehand without MTP), depth d proposes the trunk's own next token with
probability p[d] and a wrong token otherwise. Greedy acceptance then accepts draft d with rate p[d]
whenever drafts 1..d-1 were accepted, which is what the server's per-depth statistics measure.
"""

from __future__ import annotations

import random


class DraftOracle:
    def __init__(self, spec, p: list[float], refs: dict[str, list[int]], vocab: int, seed: int = 0):
        self.spec, self.p, self.refs, self.vocab = spec, p, refs, vocab
        self.rng = random.Random(seed)
        self.drafts: dict[str, list[int]] = {}
        self.proposed = [0] * len(p)  # drafts proposed per depth while the context was on the reference
        self._orig = spec._pick
        spec._pick = self.pick

    def remove(self) -> None:
        self.spec._pick = self._orig

    def pick(self, reqs, depth: int, idx: list[int], logits) -> list[int]:
        toks = self._orig(reqs, depth, idx, logits)
        for k, i in enumerate(idx):
            req = reqs[i]
            ref = self.refs.get(req.rid)
            if depth == 0:
                self.drafts[req.rid] = []
            # The pending token (fill_ids[kv_len]) and this step's drafts so far come before the draft.
            ctx = req.fill_ids[: req.kv_len + 1] + self.drafts[req.rid]
            if ref is not None and len(ctx) < len(ref) and ctx == ref[: len(ctx)]:
                right = ref[len(ctx)]
                toks[k] = right if self.rng.random() < self.p[depth] else (right + 1) % self.vocab
                self.proposed[depth] += 1
            self.drafts[req.rid].append(toks[k])
        return toks
