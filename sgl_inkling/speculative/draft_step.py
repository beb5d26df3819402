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
With `tail`, depths past the drafting ones skip the step (a depth costs a whole dense layer's
weights whatever it consumes): they lag, and the kept tokens with depth tail - 1's outputs for them
go to the lag buffers; `catch_up_tail` runs them over what they lag (up to C = 2K + 1 tokens) later.
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
import xgrammar as xgr

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode


class DraftStep:
    def __init__(self, runner, num_steps: int, carry, trunk_capture: dict, depth_capture: dict, draft_buf,
                 lag_ids: torch.Tensor, lag_hidden: torch.Tensor):  # fmt: skip
        self.runner = runner
        self.k = num_steps
        self.carry = carry  # [rows, K, H] fp32
        self.trunk_capture = trunk_capture
        self.depth_capture = depth_capture
        self.draft_buf = draft_buf  # [rows, K] int64
        # What lagging depths still have to consume (lagging.py): tokens [rows, C + 1] and the level
        # below's outputs for them [rows, C + 1, H] fp32; column C takes the writes past a row's kept tokens.
        self.lag_ids, self.lag_hidden = lag_ids, lag_hidden
        self.tail_capacity = lag_ids.shape[1] - 1  # C = 2K + 1: the depths' conv windows hold that many tokens
        self.trunk_layers = runner.model.cfg.num_hidden_layers
        self.mask_bits = self._mask_bits(runner.model.draft_vocab)

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
        first: int = 0,  # > 0: a tail's catch-up (lagging.py): depths first.. consume n <= C lagged tokens,
        # `hidden` being depth first - 1's outputs for them; nothing drafts
        tail: int | None = None,  # depths tail.. skip the step: they lag (lagging.py)
        lag_at: torch.Tensor | None = None,  # [B] with tail: where the kept tokens go in the lag buffers
    ) -> None:
        k, b = self.k, rows.shape[0]
        depths = k if depths is None else depths
        end = k if tail is None else tail
        if first and depths:
            raise ValueError("a tail's catch-up drafts nothing")
        if not depths <= end <= k or (end < k and lag_at is None):
            raise ValueError(f"tail {tail}: the drafting depths ({depths}) run, and lag_at says where the rest lag")
        dev, dtype = rows.device, self.runner.dtype
        if restore_trunk:
            self.restore_trunk(rows, n)
        if callable(first_mask):  # computed on the host while the device rolls the trunk back
            first_mask = first_mask()
        # T_d: a drafting depth takes n kept + pending + d drafts, the others the n kept tokens (padded;
        # up to C lagged ones in a catch-up).
        consume = self.tail_capacity if first else k + 1
        widths = [k + 2 + d if d < depths else consume for d in range(k)]
        read = max(k + 1, widths[first] - 1)  # the columns of `hidden` the first depth reads
        if hidden.shape[1] < read:  # a shorter verify: pad (never real: n <= r)
            hidden = torch.nn.functional.pad(hidden, (0, 0, 0, read - hidden.shape[1]))
        seq = torch.nn.functional.pad(ids, (0, 2 * k + 2 - ids.shape[1]))  # [B, 2K + 2] tokens from q on
        seq.scatter_(1, n[:, None], pending[:, None])
        # Every depth's index inputs at once, as [depth, request, column] grids of which depth d
        # takes its first T_d columns (a view at batch 1): computed per depth, these small ops
        # were most of the step's launches.
        cols = torch.arange(max(widths), device=dev)
        step = torch.arange(1, k + 1, device=dev)[:, None]  # d + 1
        drafted = step.clone()  # tokens past the kept ones a depth consumes: pending + d drafts, or none
        drafted[depths:] = 0
        at = start[:, None] + cols
        tables = self.runner.req_to_token
        tok = at.clamp(max=tables.max_context_len - 1)
        real = cols < (n + live * drafted)[:, :, None]
        out_loc = torch.where(real, tables.full[rows[:, None], tok], 0)
        out_loc_swa = torch.where(real, tables.swa[rows[:, None], tok], 0)
        positions = at - step[:, :, None]
        prefix = start - step
        # widths as a device tensor without a host copy (graphs are captured here): drafting depths
        # take K + 2 + d, the others `consume`. Materialised: the kernels read extend_lens[d] at unit
        # stride, and a broadcast view's row would hand them the next depths' widths (past b = 1).
        extend_lens = torch.where(step <= depths, k + 1 + step, consume).expand(k, b).contiguous()
        arange_b = torch.arange(b, device=dev)
        last = n - 1
        # the last real token: the pending one for depth 0, draft d after it
        logits_indices = arange_b * extend_lens + last.clamp(max=k) + step
        draft_at = n + step
        # The carry is read before and written after every depth: each depth reads only its own.
        carried = self.carry[rows].to(dtype)
        new_carry = []
        below = hidden  # the lower level's outputs for the tokens from q on
        drafts = []
        for d in range(first, end):
            t, drafting = widths[d], d < depths
            layer = self.trunk_layers + d
            # Converted piecewise rather than concatenated in fp32: the same values, one copy fewer.
            inputs = torch.cat([carried[:, d, None], below[:, : t - 1].to(dtype)], dim=1)
            new_carry.append(below[arange_b, last])  # the input for token q + n
            fb = ForwardBatch(
                mode=ForwardMode.EXTEND,
                input_ids=seq[:, :t].reshape(-1),
                positions=positions[d, :, :t].reshape(-1),
                req_pool_indices=rows,
                prefix_lens=prefix[d],
                extend_lens=extend_lens[d],
                out_loc=out_loc[d, :, :t].reshape(-1),
                out_loc_swa=out_loc_swa[d, :, :t].reshape(-1),
                logits_indices=logits_indices[d] if drafting else arange_b[:0],
                prefix_lens_cpu=[p - d - 1 for p in host_start] if host_start is not None else [1] * b,
                extend_lens_cpu=[t] * b,
                prefixes_cached=True,  # every start >= min_start, padded requests too: windows need no mask
            )
            fb.table_offset = d + 1
            fb.sconv_capture = {layer: self.depth_capture[layer]}
            out = self.runner.forward_mtp(d, inputs.view(b * t, -1), fb)
            below = out.hidden.view(b, t, -1)
            if drafting:
                draft = self.pick(out.logits, first_mask if d == 0 else None)
                seq.scatter_(1, draft_at[d, :, None], draft[:, None])
                drafts.append(draft)
        # No depth reads its conv state again in this step: all of them roll back at once.
        ran = None if (first, end) == (0, k) else range(self.trunk_layers + first, self.trunk_layers + end)
        self.depth_capture.restore(rows, n, ran)
        self.carry[rows, first:end] = torch.stack(new_carry, dim=1).float()
        if drafts:
            self.draft_buf[rows, :depths] = torch.stack(drafts, dim=1)
        if end < k:  # the skipped depths' inputs for the kept tokens: depth end - 1's outputs
            j = torch.arange(k + 1, device=dev)
            at_lag = torch.where(j < n[:, None], lag_at[:, None] + j, self.tail_capacity)
            self.lag_ids[rows[:, None], at_lag] = seq[:, : k + 1]
            self.lag_hidden[rows[:, None], at_lag] = below[:, : k + 1].float()

    def catch_up_tail(self, rows: torch.Tensor, start: torch.Tensor, n: torch.Tensor, first: int,
                      host_start: list[int] | None = None) -> None:  # fmt: skip
        """Depths first.. consume the n[i] <= C tokens they lag from start[i] on (lagging.py), read
        from the lag buffers: the same step with nothing drafted and the trunk left alone."""
        zeros = torch.zeros_like(n)
        self.run(rows, start, n, zeros, self.lag_ids[rows], zeros, self.lag_hidden[rows], host_start=host_start,
                 depths=0, restore_trunk=False, first=first)  # fmt: skip

    def pick(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """A depth's drafts: the argmax (over the draft vocabulary when there is a token map), within
        `mask` (an xgrammar bitmask over the full vocabulary, one row per request) when given."""
        logits = logits.float()
        vocab = self.runner.model.draft_vocab
        if mask is not None:
            if self.mask_bits[0] is not vocab:  # a new draft vocabulary (tests switch it between steps)
                self.mask_bits = self._mask_bits(vocab)
            _, word, bit = self.mask_bits
            allowed = (mask[:, word] >> bit.to(mask.dtype)) & 1  # column j is token ids[j]
            logits = logits.masked_fill(allowed == 0, float("-inf"))
        best = logits.argmax(-1)
        return best if vocab is None else vocab[best]

    def _mask_bits(self, vocab: torch.Tensor | None) -> tuple:
        """(vocab, word, bit): where each logits column's token sits in an xgrammar bitmask. Fixed by
        the draft vocabulary, so built with it rather than in every masked step (and never while a
        graph is captured, where its values would exist only in the graph's replays)."""
        width = self.runner.model.cfg.unpadded_vocab_size
        ids = vocab if vocab is not None else torch.arange(width, device=self.runner.device)
        return vocab, ids >> 5, (ids & 31).to(xgr.bitmask_dtype)

    def restore_trunk(self, rows: torch.Tensor, n: torch.Tensor) -> None:
        """The trunk's conv state after the first n[i] tokens of the verify."""
        self.trunk_capture.restore(rows, n)
