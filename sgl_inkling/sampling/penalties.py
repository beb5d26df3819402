"""Batched logit penalties with incrementally maintained per-request token statistics.

Applied to next-token logits [B, V] before temperature, in this order:

1. repetition penalty (HF / SGLang / CTRL): for every token seen in the prompt or the output so
   far, a positive logit is divided by the penalty and a negative one multiplied by it;
2. frequency penalty: ``logit -= frequency_penalty * count`` (output tokens only, as OpenAI);
3. presence penalty: ``logit -= presence_penalty`` if the token appeared in the output;
4. logit_bias: ``logit += bias[token]``;
5. min_new_tokens: while fewer than min_new_tokens tokens were generated, the request's stop
   token ids and the model's EOS ids get ``-inf``.

Dense [B, V] state is only allocated when some row in the batch needs it, and is kept on the
logits' device; nothing here reads device values back to the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .host_copy import to_device
from .sampling_params import SamplingParams

IndexLike = torch.Tensor | Sequence[int]


class PenaltyState:
    """Penalty parameters and token statistics for the rows of a running batch.

    Row i of this state corresponds to row i of the logits passed to `apply`. Keep it in step
    with the batch through `add_requests` (append rows), `add_tokens` (after each sampling
    step), `keep_rows` / `remove_rows` (finished requests) and `merge` (batches joined).
    """

    def __init__(self, vocab_size: int, device: torch.device | str = "cpu") -> None:
        self.vocab_size = int(vocab_size)
        self.device = torch.device(device)
        # Host copies of the per-row parameters; device tensors are rebuilt when rows change.
        self._rep: list[float] = []
        self._freq: list[float] = []
        self._pres: list[float] = []
        self._min_new: list[int] = []
        self._stop_ids: list[tuple[int, ...]] = []
        self._bias: list[dict[int, float]] = []
        # Device statistics. counts: output-token counts (float32 is exact up to 2**24).
        self.counts: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None
        self.output_lens = torch.zeros(0, dtype=torch.int64, device=self.device)
        self._dirty = True
        self._tensors: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ bookkeeping

    @property
    def num_rows(self) -> int:
        return len(self._rep)

    def __len__(self) -> int:
        return self.num_rows

    @property
    def use_repetition(self) -> bool:
        return any(r != 1.0 for r in self._rep)

    @property
    def use_frequency(self) -> bool:
        return any(f != 0.0 for f in self._freq)

    @property
    def use_presence(self) -> bool:
        return any(p != 0.0 for p in self._pres)

    @property
    def use_min_new_tokens(self) -> bool:
        return any(m > 0 for m in self._min_new)

    @property
    def use_logit_bias(self) -> bool:
        return any(self._bias)

    @property
    def is_active(self) -> bool:
        """Whether `apply` would change any logit (host-side check, no device sync)."""
        return (
            self.use_repetition
            or self.use_frequency
            or self.use_presence
            or self.use_min_new_tokens
            or self.use_logit_bias
        )

    def _needs_counts(self) -> bool:
        return self.use_repetition or self.use_frequency or self.use_presence

    def _check_ids(self, ids: Sequence[int], what: str) -> None:
        for t in ids:
            if not 0 <= int(t) < self.vocab_size:
                raise ValueError(f"{what}: token id {t} is outside the vocabulary [0, {self.vocab_size})")

    # ------------------------------------------------------------------ row management

    def add_requests(
        self,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        output_token_ids: Sequence[Sequence[int]] | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        """Append one row per request.

        prompt_token_ids feed the repetition penalty (None: no prompt tokens). output_token_ids
        are tokens already generated (e.g. a request resumed after preemption); they count for
        all penalties and for min_new_tokens. eos_token_ids are masked with the request's
        stop_token_ids until min_new_tokens is reached.
        """
        n_new = len(params)
        if prompt_token_ids is not None and len(prompt_token_ids) != n_new:
            raise ValueError("prompt_token_ids must have one entry per request")
        if output_token_ids is not None and len(output_token_ids) != n_new:
            raise ValueError("output_token_ids must have one entry per request")
        eos = tuple(int(t) for t in eos_token_ids)
        self._check_ids(eos, "eos_token_ids")
        start = self.num_rows
        for p in params:
            self._rep.append(float(p.repetition_penalty))
            self._freq.append(float(p.frequency_penalty))
            self._pres.append(float(p.presence_penalty))
            self._min_new.append(int(p.min_new_tokens))
            stop = tuple(sorted(set(eos) | {int(t) for t in (p.stop_token_ids or ())}))
            self._check_ids(stop, "stop_token_ids")
            self._stop_ids.append(stop)
            bias = p.logit_bias_ids
            self._check_ids(list(bias), "logit_bias")
            self._bias.append(bias)
        total = self.num_rows

        out_lens = [len(o) for o in output_token_ids] if output_token_ids is not None else [0] * n_new
        self.output_lens = torch.cat([self.output_lens, to_device(out_lens, torch.int64, self.device)])
        if self._needs_counts():
            self.counts = self._grow(self.counts, total, torch.float32)
            if output_token_ids is not None:
                rows, toks = _flatten_rows(output_token_ids, start)
                self._check_ids(toks, "output_token_ids")
                self._scatter_add(rows, toks)
        if self.use_repetition:
            self.prompt_mask = self._grow(self.prompt_mask, total, torch.bool)
            if prompt_token_ids is not None:
                rows, toks = _flatten_rows(prompt_token_ids, start)
                self._check_ids(toks, "prompt_token_ids")
                if rows:
                    r = to_device(rows, torch.int64, self.device)
                    t = to_device(toks, torch.int64, self.device)
                    # A device tensor of values: a Python scalar would be copied over synchronously.
                    self.prompt_mask.index_put_((r, t), torch.ones(r.shape, dtype=torch.bool, device=self.device))
        self._dirty = True

    def _grow(self, t: torch.Tensor | None, rows: int, dtype: torch.dtype) -> torch.Tensor:
        # Rows that predate the allocation do not use this statistic, so zeros are correct.
        if t is None:
            return torch.zeros(rows, self.vocab_size, dtype=dtype, device=self.device)
        if t.shape[0] == rows:
            return t
        pad = torch.zeros(rows - t.shape[0], self.vocab_size, dtype=dtype, device=self.device)
        return torch.cat([t, pad])

    def _scatter_add(self, rows: IndexLike, toks: IndexLike) -> None:
        assert self.counts is not None
        r = to_device(rows, torch.int64, self.device)
        t = to_device(toks, torch.int64, self.device)
        if r.numel():
            # Repeated (row, token) pairs must add up: an atomic index_add_ on the flat view does, and
            # unlike index_put_(accumulate=True) it never waits for the device.
            ones = torch.ones(r.shape, dtype=self.counts.dtype, device=self.device)
            self.counts.view(-1).index_add_(0, r * self.vocab_size + t, ones)

    def add_tokens(self, row_indices: IndexLike | None, token_ids: IndexLike) -> None:
        """Record newly generated tokens: token_ids[j] was appended to row row_indices[j].

        row_indices=None means one token for every row, in order (the usual decode step).
        Both may be device tensors; nothing is synchronised.
        """
        toks = to_device(token_ids, torch.int64, self.device).reshape(-1)
        if row_indices is None:
            if toks.numel() != self.num_rows:
                raise ValueError(f"expected {self.num_rows} token ids, got {toks.numel()}")
            rows = torch.arange(self.num_rows, device=self.device)
        else:
            rows = to_device(row_indices, torch.int64, self.device).reshape(-1)
            if rows.numel() != toks.numel():
                raise ValueError("row_indices and token_ids must have the same length")
        if rows.numel() == 0:
            return
        self.output_lens.index_add_(0, rows, torch.ones_like(rows))
        if self.counts is not None:
            self._scatter_add(rows, toks)

    def keep_rows(self, keep: IndexLike) -> None:
        """Keep only the given rows, in the given order (SGLang's filter_batch)."""
        idx_list = [int(i) for i in (keep.tolist() if isinstance(keep, torch.Tensor) else keep)]
        for name in ("_rep", "_freq", "_pres", "_min_new", "_stop_ids", "_bias"):
            old = getattr(self, name)
            setattr(self, name, [old[i] for i in idx_list])
        idx = to_device(idx_list, torch.int64, self.device)
        self.output_lens = self.output_lens.index_select(0, idx)
        # Drop dense state that no remaining row needs, to free memory.
        self.counts = (
            self.counts.index_select(0, idx) if self.counts is not None and self._needs_counts() else None
        )
        self.prompt_mask = (
            self.prompt_mask.index_select(0, idx)
            if self.prompt_mask is not None and self.use_repetition
            else None
        )
        self._dirty = True

    def remove_rows(self, rows: IndexLike) -> None:
        drop = {int(i) for i in (rows.tolist() if isinstance(rows, torch.Tensor) else rows)}
        self.keep_rows([i for i in range(self.num_rows) if i not in drop])

    def merge(self, other: PenaltyState) -> None:
        """Append other's rows after ours (SGLang's merge_batch)."""
        if other.vocab_size != self.vocab_size:
            raise ValueError("cannot merge penalty states with different vocab sizes")
        n_self, n_other = self.num_rows, other.num_rows
        for name in ("_rep", "_freq", "_pres", "_min_new", "_stop_ids", "_bias"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.output_lens = torch.cat([self.output_lens, other.output_lens.to(self.device)])

        def cat(a: torch.Tensor | None, b: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
            if a is None and b is None:
                return None
            a = a if a is not None else torch.zeros(n_self, self.vocab_size, dtype=dtype, device=self.device)
            b = (
                b.to(self.device)
                if b is not None
                else torch.zeros(n_other, self.vocab_size, dtype=dtype, device=self.device)
            )
            return torch.cat([a, b])

        self.counts = cat(self.counts, other.counts, torch.float32)
        self.prompt_mask = cat(self.prompt_mask, other.prompt_mask, torch.bool)
        self._dirty = True

    # ------------------------------------------------------------------ application

    def _refresh(self) -> None:
        if not self._dirty:
            return

        def dev(values: list, dtype: torch.dtype) -> torch.Tensor:
            return to_device(values, dtype, self.device)

        t: dict[str, torch.Tensor] = {
            "rep": dev(self._rep, torch.float32).unsqueeze(1),
            "freq": dev(self._freq, torch.float32).unsqueeze(1),
            "pres": dev(self._pres, torch.float32).unsqueeze(1),
            "min_new": dev(self._min_new, torch.int64),
        }
        # Sparse (row, token) lists: stop ids only matter for rows with min_new_tokens > 0.
        stop_rows = [i for i, m in enumerate(self._min_new) if m > 0 for _ in self._stop_ids[i]]
        stop_toks = [tok for i, m in enumerate(self._min_new) if m > 0 for tok in self._stop_ids[i]]
        t["stop_rows"] = dev(stop_rows, torch.int64)
        t["stop_toks"] = dev(stop_toks, torch.int64)
        bias_rows = [i for i, b in enumerate(self._bias) for _ in b]
        bias_toks = [tok for b in self._bias for tok in b]
        bias_vals = [v for b in self._bias for v in b.values()]
        t["bias_rows"] = dev(bias_rows, torch.int64)
        t["bias_toks"] = dev(bias_toks, torch.int64)
        t["bias_vals"] = dev(bias_vals, torch.float32)
        self._tensors = t
        self._dirty = False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Apply all penalties to logits [B, V] in place; returns logits."""
        if logits.dim() != 2 or logits.shape[0] != self.num_rows:
            raise ValueError(f"logits must be [{self.num_rows}, V], got {tuple(logits.shape)}")
        if logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits vocab {logits.shape[1]} != penalty state vocab {self.vocab_size}")
        if not self.is_active:
            return logits
        self._refresh()
        t = self._tensors

        if self.use_repetition:
            assert self.counts is not None and self.prompt_mask is not None
            seen = (self.counts > 0) | self.prompt_mask
            rep = t["rep"].to(logits.dtype)
            penalised = torch.where(logits > 0, logits / rep, logits * rep)
            # Rows with penalty 1.0 are unchanged exactly (x / 1 == x * 1 == x).
            logits.copy_(torch.where(seen, penalised, logits))
        if self.use_frequency:
            assert self.counts is not None
            logits.sub_(t["freq"].to(logits.dtype) * self.counts.to(logits.dtype))
        if self.use_presence:
            assert self.counts is not None
            logits.sub_(t["pres"].to(logits.dtype) * (self.counts > 0).to(logits.dtype))
        if self.use_logit_bias:
            # (row, token) pairs are unique (one dict per row), so a plain gather-add-scatter suffices.
            rows, toks = t["bias_rows"], t["bias_toks"]
            logits[rows, toks] = logits[rows, toks] + t["bias_vals"].to(logits.dtype)
        if self.use_min_new_tokens and t["stop_rows"].numel():
            rows, toks = t["stop_rows"], t["stop_toks"]
            still_short = (self.output_lens < t["min_new"])[rows]
            current = logits[rows, toks]
            # (row, token) pairs are unique, so this scatter has no write conflicts.
            logits[rows, toks] = torch.where(still_short, torch.full_like(current, float("-inf")), current)
        return logits


def _flatten_rows(per_row: Sequence[Sequence[int]], start: int) -> tuple[list[int], list[int]]:
    rows: list[int] = []
    toks: list[int] = []
    for i, ids in enumerate(per_row):
        ids = list(ids)
        rows.extend([start + i] * len(ids))
        toks.extend(int(x) for x in ids)
    return rows, toks
