"""The part of a speculative step after acceptance, at fixed shapes (capturable in a CUDA graph).

After a verify of [x_q, d_1..d_K] at tokens q..q+K of which the first n were kept (n = accepted
drafts + 1; fewer when the request finished), with pending token p (the trunk's extra token):
1. the trunk's conv state goes back to just after those n tokens (from the verify's windows);
2. depth d consumes tokens q..q+n-1 (committed), p and drafts 1..d of this step (speculative):
   n + 1 + d real tokens, padded to T_d = K + 2 + d per request so every shape depends on the
   batch size only. Padding comes after the real tokens, so causal attention and the causal conv
   keep it out of the real rows; its KV goes to the padding slot 0. Depth d's logits at its last
   real token give draft d + 1, which becomes a real token of depth d + 1;
3. each depth's conv state is restored to its commit point (after the n committed tokens) and its
   carried input becomes the lower level's output for token q + n - 1.
The same step catches the depths up after plain decode steps (lagging.py): the tokens the trunk
consumed there stand for the kept ones, and the trunk is not restored (step 1 skipped).
This is the same computation as levels.DepthChain for the step (which the eager paths use: prefill,
short prompts), arranged so that no count reaches the host: the drafts land in `draft_buf[row]`,
where the next verify reads them.
Grammar-constrained requests: their grammar's state at draft time is known on the host, so the
mask of their first draft comes in as an xgrammar bitmask (`first_mask`, all ones for the others)
and depth 0's logits are masked before the argmax; deeper drafts are unconstrained here (their
masks depend on drafts only the device knows) and the host caps each request's drafts at the
longest legal prefix afterwards (grammar_drafts.py).
"""

from __future__ import annotations

import torch

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode


class DraftStep:
    def __init__(self, runner, num_steps: int, carry, trunk_capture: dict, depth_capture: dict, draft_buf):
        self.runner = runner
        self.k = num_steps
        self.carry = carry  # [rows, K, H] fp32
        self.trunk_capture = trunk_capture
        self.depth_capture = depth_capture
        self.draft_buf = draft_buf  # [rows, K] int64
        self.trunk_layers = runner.model.cfg.num_hidden_layers

    def min_start(self) -> int:
        """Depth d never consumes tokens 0..d: every request must be past them (else: DepthChain)."""
        return self.k + 1

    def max_token(self, start: int) -> int:
        """The last table column a step starting at `start` touches, padding included."""
        return start + 2 * self.k + 1

    def run(
        self,
        rows: torch.Tensor,  # [B] request rows
        start: torch.Tensor,  # [B] committed length before the verify (q)
        n: torch.Tensor,  # [B] verified tokens kept, 1..r
        live: torch.Tensor,  # [B] 1 if the request goes on (drafts wanted), 0 if it finished
        ids: torch.Tensor,  # [B, r] the verified tokens, r <= K + 1
        pending: torch.Tensor,  # [B] the trunk's token after the kept ones
        hidden: torch.Tensor,  # [B, r, H] trunk outputs of the verified tokens
        host_start: list[int] | None = None,  # `start` on the host, for the reference backend's loops
        depths: int | None = None,  # depths that draft (default K); the others only consume the kept tokens
        restore_trunk: bool = True,  # False: the trunk is already past the n tokens (plain steps' catch-up)
        first_mask=None,  # [B, ceil(V / 32)] int32 bitmask of draft 1, or a callable giving it (or None)
    ) -> None:
        k, b = self.k, rows.shape[0]
        depths = k if depths is None else depths
        dev = rows.device
        if restore_trunk:
            self.restore_trunk(rows, n)
        if callable(first_mask):  # computed on the host while the device rolls the trunk back
            first_mask = first_mask()
        if ids.shape[1] < k + 1:  # a shorter verify: pad to K + 1 (never real: n <= r)
            ids = torch.nn.functional.pad(ids, (0, k + 1 - ids.shape[1]))
            hidden = torch.nn.functional.pad(hidden, (0, 0, 0, k + 1 - hidden.shape[1]))
        seq = torch.cat([ids, ids.new_zeros(b, k + 1)], dim=1)  # [B, 2K + 2] tokens from q on
        seq.scatter_(1, n[:, None], pending[:, None])
        arange_b = torch.arange(b, device=dev)
        below = hidden  # the lower level's outputs for the tokens from q on
        tables = self.runner.req_to_token
        last_col = tables.max_context_len - 1
        drafts = []
        for d in range(k):
            drafting = d < depths
            # A drafting depth: n kept + pending + d drafts; the others: the n kept tokens.
            t = k + 2 + d if drafting else k + 1
            layer = self.trunk_layers + d
            cols = torch.arange(t, device=dev)
            inputs = torch.cat([self.carry[rows, d][:, None], below[:, : t - 1].float()], dim=1)
            self.carry[rows, d] = below[arange_b, n - 1].float()  # after reading: input for token q + n
            real = cols[None] < (n + live * (1 + d) if drafting else n)[:, None]
            tok = (start[:, None] + cols).clamp(max=last_col)
            prefix = start - d - 1
            fb = ForwardBatch(
                mode=ForwardMode.EXTEND,
                input_ids=seq[:, :t].reshape(-1),
                positions=(prefix[:, None] + cols).reshape(-1),
                req_pool_indices=rows,
                prefix_lens=prefix,
                extend_lens=torch.full((b,), t, dtype=torch.int64, device=dev),
                out_loc=torch.where(real, tables.full[rows[:, None], tok], 0).reshape(-1),
                out_loc_swa=torch.where(real, tables.swa[rows[:, None], tok], 0).reshape(-1),
                # the last real token: the pending one for depth 0, draft d after it
                logits_indices=arange_b * t + (n + d).clamp(max=t - 1) if drafting else arange_b[:0],
                prefix_lens_cpu=[p - d - 1 for p in host_start] if host_start is not None else [1] * b,
                extend_lens_cpu=[t] * b,
            )
            fb.table_offset = d + 1
            fb.sconv_capture = {layer: self.depth_capture[layer]}
            out = self.runner.forward_mtp(d, inputs.reshape(b * t, -1).to(self.runner.dtype), fb)
            self.restore([(layer, self.depth_capture[layer])], rows, n)
            below = out.hidden.view(b, t, -1)
            if drafting:
                draft = self.pick(out.logits, first_mask if d == 0 else None)
                seq.scatter_(1, (n + 1 + d)[:, None], draft[:, None])
                drafts.append(draft)
        if drafts:
            self.draft_buf[rows, :depths] = torch.stack(drafts, dim=1)

    def pick(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """A depth's drafts: the argmax (over the draft vocabulary when there is a token map), within
        `mask` (an xgrammar bitmask over the full vocabulary, one row per request) when given."""
        logits = logits.float()
        vocab = self.runner.model.draft_vocab
        if mask is not None:
            ids = vocab if vocab is not None else torch.arange(logits.shape[1], device=logits.device)
            allowed = (mask[:, ids >> 5] >> (ids & 31).to(mask.dtype)) & 1  # column j is token ids[j]
            logits = logits.masked_fill(allowed == 0, float("-inf"))
        best = logits.argmax(-1)
        return best if vocab is None else vocab[best]

    def restore_trunk(self, rows: torch.Tensor, n: torch.Tensor) -> None:
        """The trunk's conv state after the first n[i] tokens of the verify."""
        self.restore(self.trunk_capture.items(), rows, n)

    def restore(self, layers, rows: torch.Tensor, n: torch.Tensor) -> None:
        """Each layer's conv state after the first n[i] tokens of its captured window."""
        width = self.runner.sconv_pool.width
        idx = n[:, None] + torch.arange(width, device=n.device)  # [B, width]
        states = self.runner.sconv_pool.states
        for layer, caps in layers:
            for state, cap in zip(states[layer], caps):
                state[rows] = cap[rows[:, None], idx]
