"""Per-row sampling tensors for one batch, built from the requests' SamplingParams."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .host_copy import to_device
from .penalties import PenaltyState
from .sampling_params import SamplingParams


@dataclass
class SamplingBatchInfo:
    """Row i describes request i of the batch (row i of the logits).

    Greedy rows carry temperature 1.0 so that dividing by it is harmless; they are decoded by
    argmax regardless of the other fields. top_ks holds vocab_size where top-k is off.
    """

    temperatures: torch.Tensor  # [B] float32
    top_ps: torch.Tensor  # [B] float32
    top_ks: torch.Tensor  # [B] int64
    min_ps: torch.Tensor  # [B] float32
    is_greedy: torch.Tensor  # [B] bool
    seeds: list[int | None]
    vocab_size: int
    device: torch.device
    params: list[SamplingParams]
    penalties: PenaltyState | None = None
    # Allowed-token mask [B, V] (True = allowed), set by the grammar layer when needed.
    vocab_mask: torch.Tensor | None = None

    # Host-side flags so the sampler can pick code paths without reading device memory.
    is_all_greedy: bool = False
    any_greedy: bool = False
    need_top_k: bool = False
    need_top_p: bool = False
    need_min_p: bool = False

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        vocab_size: int,
        device: torch.device | str = "cpu",
        *,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        output_token_ids: Sequence[Sequence[int]] | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> SamplingBatchInfo:
        """Build the batch tensors; a PenaltyState is attached only if some request needs one.

        prompt_token_ids / output_token_ids / eos_token_ids are passed to the PenaltyState (see
        PenaltyState.add_requests) and are only needed when penalties are in use.
        """
        params = list(params)
        device = torch.device(device)
        greedy = [p.is_greedy for p in params]
        temps = [1.0 if g else float(p.temperature) for p, g in zip(params, greedy)]
        top_ks = [vocab_size if p.top_k < 0 else min(int(p.top_k), vocab_size) for p in params]
        top_ps = [float(p.top_p) for p in params]
        min_ps = [float(p.min_p) for p in params]

        penalties = None
        if any(p.needs_penalties for p in params):
            penalties = PenaltyState(vocab_size, device)
            penalties.add_requests(params, prompt_token_ids, output_token_ids, eos_token_ids)

        # One staged copy for the per-row fields (each would pin and copy on its own every step):
        # float32 rows, the greedy flags and the top-k counts cast on the device. Top-k counts go
        # their own way only past 2^24, where float32 stops holding every integer.
        exact = vocab_size < 2**24
        rows = to_device(
            [temps, top_ps, min_ps, [float(g) for g in greedy]] + ([top_ks] if exact else []), torch.float32, device
        )
        temperatures, top_ps_t, min_ps_t, is_greedy_t = rows[0], rows[1], rows[2], rows[3].bool()
        top_ks_t = rows[4].long() if exact else to_device(top_ks, torch.int64, device)
        info = cls(
            temperatures=temperatures,
            top_ps=top_ps_t,
            top_ks=top_ks_t,
            min_ps=min_ps_t,
            is_greedy=is_greedy_t,
            seeds=[None if p.seed is None else int(p.seed) for p in params],
            vocab_size=int(vocab_size),
            device=device,
            params=params,
            penalties=penalties,
        )
        info._set_flags()
        return info

    def _set_flags(self) -> None:
        greedy = [p.is_greedy for p in self.params]
        self.is_all_greedy = all(greedy)
        self.any_greedy = any(greedy)
        # Filters on greedy rows never matter, so only sampled rows select code paths.
        sampled = [(p, min(p.top_k, self.vocab_size)) for p in self.params if not p.is_greedy]
        self.need_top_k = any(0 < k < self.vocab_size for _, k in sampled)
        self.need_top_p = any(p.top_p < 1.0 for p, _ in sampled)
        self.need_min_p = any(p.min_p > 0.0 for p, _ in sampled)

    def __len__(self) -> int:
        return len(self.params)

    @property
    def has_seeds(self) -> bool:
        return any(s is not None for s in self.seeds)

    def keep_rows(self, keep: Sequence[int] | torch.Tensor) -> None:
        """Keep only the given rows, in the given order (finished requests removed)."""
        idx_list = [int(i) for i in (keep.tolist() if isinstance(keep, torch.Tensor) else keep)]
        idx = to_device(idx_list, torch.int64, self.device)
        for name in ("temperatures", "top_ps", "top_ks", "min_ps", "is_greedy"):
            setattr(self, name, getattr(self, name).index_select(0, idx))
        if self.vocab_mask is not None:
            self.vocab_mask = self.vocab_mask.index_select(0, idx)
        self.params = [self.params[i] for i in idx_list]
        self.seeds = [self.seeds[i] for i in idx_list]
        if self.penalties is not None:
            self.penalties.keep_rows(idx_list)
            if not self.penalties.is_active and not any(p.needs_penalties for p in self.params):
                self.penalties = None
        self._set_flags()

    def merge(self, other: SamplingBatchInfo) -> None:
        """Append other's rows after ours."""
        if other.vocab_size != self.vocab_size:
            raise ValueError("cannot merge batches with different vocab sizes")
        for name in ("temperatures", "top_ps", "top_ks", "min_ps", "is_greedy"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name).to(self.device)]))
        if self.vocab_mask is not None or other.vocab_mask is not None:
            # A batch without a mask allows every token.
            def mask_of(info: SamplingBatchInfo) -> torch.Tensor:
                if info.vocab_mask is not None:
                    return info.vocab_mask.to(self.device)
                return torch.ones(len(info), self.vocab_size, dtype=torch.bool, device=self.device)

            self.vocab_mask = torch.cat([mask_of(self), mask_of(other)])
        if self.penalties is not None or other.penalties is not None:
            # Rows of a batch without a PenaltyState use no penalties, so empty rows stand in.
            mine = self.penalties or _blank_penalties(self.params, self.vocab_size, self.device)
            theirs = other.penalties or _blank_penalties(other.params, self.vocab_size, self.device)
            mine.merge(theirs)
            self.penalties = mine
        self.params = self.params + other.params
        self.seeds = self.seeds + other.seeds
        self._set_flags()


def _blank_penalties(params: list[SamplingParams], vocab_size: int, device: torch.device) -> PenaltyState:
    state = PenaltyState(vocab_size, device)
    state.add_requests(params)
    return state
