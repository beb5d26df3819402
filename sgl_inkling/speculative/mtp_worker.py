"""MTP speculative decoding: the depths draft a chain of tokens, the trunk verifies it in one forward.

A step for a running request with committed length q (every level has consumed tokens [0, q)),
pending token x_q and drafts d_1..d_K:
1. verify: the trunk consumes [x_q, d_1..d_K] (positions q..q+K); its conv windows are captured;
2. accept (acceptance.py): a drafts and one trunk token, truncated where the request finishes;
   the trunk's conv state is restored to just after the n consumed tokens that were kept, and the
   KV of rejected drafts stays in slots the request owns (overwritten later);
3. draft (levels.py): every depth consumes the newly committed tokens, then speculatively the new
   pending token and the drafts of the depths before it; depth d's logits give draft d + 1.
Each depth is restored to its commit point afterwards, so after every step the trunk and all
depths hold exactly the state of the accepted tokens.
"""

from __future__ import annotations

import torch
import xgrammar as xgr

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.speculative.levels import DepthChain, LevelSeq

VERIFY_GRAPH_MAX_BS = 64  # larger verify batches run eagerly (they are compute-bound anyway)


class MTPWorker:
    def __init__(self, runner: ModelRunner, num_steps: int | None, grammar_backend=None):
        model = runner.model
        depths = model.num_mtp_layers
        if depths == 0:
            raise ValueError("--speculative-algorithm MTP: this checkpoint has no MTP layers (model.mtp.*)")
        num_steps = depths if num_steps is None else num_steps
        if not 1 <= num_steps <= depths:
            raise ValueError(f"--speculative-num-steps must be in 1..{depths} for this checkpoint, got {num_steps}")
        self.runner = runner
        self.num_steps = num_steps  # drafts per step = depths used
        self.grammar = grammar_backend
        cfg = model.cfg
        pool = runner.sconv_pool
        self.carry = pool.add_state("mtp_carry", (num_steps, cfg.hidden_size))

        def buffers(layer: int, tokens: int) -> list[torch.Tensor]:
            return [torch.zeros(pool.size, pool.width + tokens, t.shape[-1], device=t.device) for t in pool.states[layer]]

        trunk = cfg.num_hidden_layers
        self.trunk_capture = {i: buffers(i, num_steps + 1) for i in range(trunk)}
        # A depth consumes up to K + 1 committed tokens, the pending one and K - 1 drafts per step.
        depth_capture = {trunk + d: buffers(trunk + d, 2 * num_steps + 1) for d in range(num_steps)}
        self.chain = DepthChain(runner, num_steps, self.carry, depth_capture)
        self.verify_graphs = None
        if runner.graphs is not None:  # CUDA graphs on: verify steps replay per batch bucket too
            from sgl_inkling.speculative.verify_graphs import VerifyGraphRunner

            max_bs = min(VERIFY_GRAPH_MAX_BS, runner.graphs.buckets[-1])
            self.verify_graphs = VerifyGraphRunner(runner, num_steps + 1, self.trunk_capture, max_bs)
        self.forced_accept: float | None = None  # benchmark-only switch (bench_one_batch --mtp-force-accept)
        self._forced_credit = 0.0
        self.num_verify_steps = 0
        self.num_verify_tokens = 0  # tokens emitted by verify steps (accepted drafts + one each)

    # ---------------------------------------------------------------- prefill

    def after_extend(self, entries: list[tuple[Req, int, torch.Tensor, list[tuple[int, int]]]], ckpts) -> None:
        """The depths consume the prompt chunk the trunk just did: (req, new tokens, trunk hidden of
        those tokens, checkpoint plan as (tokens into the chunk, slot))."""
        seqs = [
            LevelSeq(
                row=req.row,
                start=req.kv_len,
                tokens=req.fill_ids[req.kv_len : req.kv_len + n],
                commit=req.kv_len + n,
                trunk_hidden=hidden,
                snapshots=[(req.kv_len + j, slot) for j, slot in plan],
            )
            for req, n, hidden, plan in entries
        ]
        self.chain.run(seqs, ckpts=ckpts)

    # ---------------------------------------------------------------- draft

    def draft(self, reqs: list[Req], starts: list[int], hidden: list[torch.Tensor]) -> None:
        """Commit the tokens each request's trunk consumed since `starts[i]` (trunk outputs in
        `hidden[i]`) at every depth, and draft the next tokens for the unfinished requests.

        Unfinished requests need KV slots for tokens [kv_len, kv_len + K] (the next verify)."""
        seqs = []
        for req, start, h in zip(reqs, starts, hidden):
            tokens = req.fill_ids[start : req.kv_len]
            if not req.finished:
                tokens = tokens + [req.fill_ids[req.kv_len]]  # the pending token, consumed speculatively
            seqs.append(LevelSeq(req.row, start, tokens, req.kv_len, h, want_drafts=not req.finished))
        open_grammars = self._start_grammars(reqs)
        drafts = self.chain.run(seqs, pick_drafts=lambda d, idx, logits: self._pick(reqs, d, idx, logits))
        for req, ds in zip(reqs, drafts):
            if not req.finished:
                req.drafts = ds
        for req in open_grammars:
            req.grammar.rollback(req.draft_tentative)
            req.draft_tentative = 0

    def _start_grammars(self, reqs: list[Req]) -> list[Req]:
        """Row 0 of each constrained request's verify masks is its grammar's state now."""
        out = []
        for req in reqs:
            req.draft_masks, req.draft_tentative, req.draft_open = None, 0, False
            req.draft_limit = self.num_steps
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

    # ---------------------------------------------------------------- verify

    def forward_verify(self, batch):
        """The trunk over [pending token, drafts] of every request, conv windows captured."""
        batch.sconv_capture = self.trunk_capture
        if self.verify_graphs is not None and self.verify_graphs.can_run(batch):
            return self.verify_graphs.replay(batch)
        return self.runner.forward(batch)

    def verify_masks(self, reqs: list[Req], logits: torch.Tensor) -> None:
        """Apply each constrained request's per-row masks to its verify logits [B, K + 1, V]."""
        if self.grammar is None:
            return
        r = self.num_steps + 1
        rows, parts = [], []
        for i, req in enumerate(reqs):
            if req.draft_masks is None:
                continue
            n = min(req.draft_limit, self.num_steps) + 1
            rows.extend(i * r + j for j in range(n))
            parts.append(req.draft_masks[:n])
        if not rows:
            return
        flat = logits.view(-1, logits.shape[-1])
        full = torch.full((flat.shape[0], parts[0].shape[1]), -1, dtype=parts[0].dtype)
        full[rows] = torch.cat(parts)
        self.grammar.masker._apply_kernel(flat, full.to(flat.device), rows)

    def forced_counts(self, n: int) -> list[int] | None:
        """Benchmark-only: accept lengths averaging `forced_accept` tokens per step (e.g. 2.5 gives
        drafts accepted 1, 2, 1, 2, ... so each step emits 2 or 3 tokens)."""
        if self.forced_accept is None:
            return None
        self._forced_credit += self.forced_accept - 1.0
        a = int(self._forced_credit)
        self._forced_credit -= a
        return [a] * n

    def restore_trunk(self, row: int, consumed: int) -> None:
        """Trunk conv state after the first `consumed` tokens of the verify forward."""
        pool = self.runner.sconv_pool
        for layer, caps in self.trunk_capture.items():
            for state, cap in zip(pool.states[layer], caps):
                state[row] = cap[row, consumed : consumed + pool.width]

    def stats(self) -> dict[str, float]:
        steps = self.num_verify_steps
        return {
            "speculative_num_steps": self.num_steps,
            "spec_verify_steps": steps,
            "avg_spec_accept_length": self.num_verify_tokens / steps if steps else 0.0,
            "spec_verify_cuda_graph": self.verify_graphs is not None,
        }
