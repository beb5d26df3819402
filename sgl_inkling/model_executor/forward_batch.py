"""What one model forward needs to know about its batch; the model never sees scheduler objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from sgl_inkling.sampling.host_copy import to_device

INT64_PER_16_BYTES = 2  # int64 fields packed in one buffer start on 16-byte boundaries (Triton's pointer alignment)

# Extends of at most this many tokens a sequence (MTP's verify and draft depths, short prompts) take
# the fused epilogues' extend forms, one program walking a sequence's tokens; longer ones keep the
# per-stream kernels, which spread a sequence's tokens over programs.
SHORT_EXTEND_TOKENS = 16


class ForwardMode(Enum):
    EXTEND = "extend"  # new tokens after a (possibly empty) cached prefix: prefill and chunked prefill
    DECODE = "decode"  # exactly one new token per sequence


@dataclass
class ForwardBatch:
    """A ragged batch: the new tokens of all sequences, flattened, sequence after sequence.

    Sequence i owns row `req_pool_indices[i]` of the req-to-token tables (which also names its
    short-conv state slot), has `prefix_lens[i]` tokens already in the caches and brings
    `extend_lens[i]` new ones; `out_loc` / `out_loc_swa` are the pool slots the new tokens' KV goes to.
    """

    mode: ForwardMode
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T] absolute position of every new token
    req_pool_indices: torch.Tensor  # [B]
    prefix_lens: torch.Tensor  # [B]
    extend_lens: torch.Tensor  # [B]
    out_loc: torch.Tensor  # [T] slots in the full-attention KV pool
    out_loc_swa: torch.Tensor  # [T] slots in the sliding-window KV pool
    logits_indices: torch.Tensor  # [N] rows of the flattened tokens that produce logits
    # Host copies for the reference backend's per-sequence loops (never read on the GPU fast path).
    prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_lens_cpu: list[int] = field(default_factory=list)
    # The rows on the host, where the batch was built from host lists (empty for the graphs' static
    # batches): per-sequence loops read them instead of waiting for the device (.tolist()).
    req_pool_indices_cpu: list[int] = field(default_factory=list)
    input_embeds: torch.Tensor | None = None  # [T, H] replaces the token embedding when set (multimodal)
    # Attached by the model runner: where attention and short-conv layers find their state.
    attn_backend: Any = None
    sconv_pool: Any = None
    # Short-conv snapshots to take during an extend, for the prefix cache: per sequence of the
    # batch, (tokens of this chunk processed, checkpoint slot) pairs, into `sconv_checkpoints`.
    sconv_snapshots: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    sconv_checkpoints: Any = None
    # Device index tensors of sconv_snapshots, built by the first short conv that takes them (by width).
    snapshot_index_cache: dict = field(default_factory=dict, repr=False)
    # MTP: layer id -> per-stream buffers [rows, K-1 + n, C] that receive each sequence's conv window
    # (prior state then the new inputs), so the state after any accepted prefix can be restored.
    sconv_capture: dict[int, list[torch.Tensor]] | None = None
    # The caller guarantees every sequence, padding included, a cached prefix (prefix_lens > 0: MTP
    # draft steps), so a captured window starts from the conv state without the fresh-prefix zeros
    # mask (prefix_lens_cpu can't tell: graphs fill it with placeholders while padded rows have none).
    prefixes_cached: bool = False
    # MTP depth d reads the req-to-token tables shifted by d + 1: its position p consumes token
    # p + d + 1 and keeps its KV in that token's slot (see speculative/levels.py).
    table_offset: int = 0
    # Values every layer of a forward shares, computed by their first caller (extend_starts, once).
    _per_forward: dict = field(default_factory=dict, init=False, repr=False)

    def once(self, key, make):
        """make(), computed once a forward and shared by every layer that asks for `key`."""
        if key not in self._per_forward:
            self._per_forward[key] = make()
        return self._per_forward[key]

    def max_extend_len(self) -> int:
        """The most new tokens any sequence brings (host lists, once a forward: every layer asks)."""
        return self.once("max_extend_len", lambda: max(self.extend_lens_cpu, default=0))

    def fused_form(self, layer_id: int) -> str | None:
        """Which form of the fused epilogues serves this layer's batch: "decode" for a plain decode
        step, "extend" for an extend of 1..SHORT_EXTEND_TOKENS tokens a sequence without conv
        snapshots to take (MTP's verify and draft depths, which capture conv windows, and short
        prompts), or a decode batch that captures them; None: the per-stream modules."""
        capture = self.sconv_capture
        if self.mode is ForwardMode.DECODE and (capture is None or layer_id not in capture):
            return "decode"
        if self.sconv_snapshots:
            return None
        return "extend" if self.mode is ForwardMode.DECODE or 0 < self.max_extend_len() <= SHORT_EXTEND_TOKENS else None

    def extend_starts(self) -> torch.Tensor:
        """Each sequence's first row in the flattened tokens ([B], the exclusive cumsum of extend_lens),
        computed once a forward: attention and every short conv of every layer share it (a cumsum
        was three launches per conv, twelve per layer of an MTP verify)."""
        return self.once("extend_starts", lambda: torch.cumsum(self.extend_lens, 0) - self.extend_lens)

    def reset_extend_starts(self) -> None:
        """Forget the per-forward values (a batch object run again, as graph warm-up and capture do)."""
        self._per_forward.clear()

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens_cpu)

    def rows_cpu(self) -> list[int]:
        """The sequences' request rows on the host (a device read only for batches built on it)."""
        return self.req_pool_indices_cpu or self.req_pool_indices.tolist()

    @property
    def seq_lens_cpu(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens_cpu, self.extend_lens_cpu)]

    @classmethod
    def build(
        cls,
        mode: ForwardMode,
        input_ids: list[list[int]] | torch.Tensor,
        req_pool_indices: list[int],
        prefix_lens: list[int],
        out_loc: list[int],
        out_loc_swa: list[int],
        device: torch.device | str,
        all_logits: bool = False,
        logits_counts: list[int] | None = None,
    ) -> ForwardBatch:
        """Assemble a batch from per-sequence host lists (new tokens of each sequence), or from a
        [B, n] device tensor when every sequence brings n tokens that are already on the device.

        Each sequence yields logits for its last `logits_counts[i]` new tokens (default 1; all of
        them with `all_logits`), in order.
        """
        on_device = isinstance(input_ids, torch.Tensor)
        extend_lens = [input_ids.shape[1]] * input_ids.shape[0] if on_device else [len(x) for x in input_ids]
        if mode is ForwardMode.DECODE and any(n != 1 for n in extend_lens):
            raise ValueError("decode batches carry exactly one new token per sequence")
        positions = [p + j for p, n in zip(prefix_lens, extend_lens) for j in range(n)]
        if all_logits:
            logits_counts = extend_lens
        elif logits_counts is None:
            logits_counts = [1] * len(extend_lens)
        logits_indices, acc = [], 0
        for n, k in zip(extend_lens, logits_counts):
            acc += n
            logits_indices.extend(range(acc - k, acc))

        # One staged copy for every field (torch.tensor(..., device="cuda") would wait for the device
        # eight times; overlap scheduling builds step n + 1 while step n runs).
        fields = [positions, req_pool_indices, prefix_lens, extend_lens, out_loc, out_loc_swa, logits_indices]
        if not on_device:
            fields.insert(0, [tok for seq in input_ids for tok in seq])
        # Every field starts on a 16-byte boundary (each padded to an even count): Triton compiles a
        # kernel variant per pointer alignment, and packed back to back a field's alignment would
        # follow the parity of the token and batch counts before it, so the first batch of the other
        # parity after warm-up (e.g. the prefix lengths the short conv reads) waited for a compile.
        starts, host = [], []
        for f in fields:
            starts.append(len(host))
            host.extend(f)
            host.extend([0] * (-len(f) % INT64_PER_16_BYTES))
        flat = to_device(host, torch.int64, device)
        views = [flat[s : s + len(f)] for s, f in zip(starts, fields)]
        ids = input_ids.reshape(-1) if on_device else views.pop(0)
        positions_t, rows, prefix_t, extend_t, out_t, out_swa_t, logits_t = views
        return cls(
            mode=mode,
            input_ids=ids,
            positions=positions_t,
            req_pool_indices=rows,
            prefix_lens=prefix_t,
            extend_lens=extend_t,
            out_loc=out_t,
            out_loc_swa=out_swa_t,
            logits_indices=logits_t,
            prefix_lens_cpu=list(prefix_lens),
            extend_lens_cpu=extend_lens,
            req_pool_indices_cpu=list(req_pool_indices),
        )
