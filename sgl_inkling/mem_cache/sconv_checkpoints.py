"""Short-conv checkpoints: snapshots of a request's conv window, owned by radix-tree nodes.

The live conv state is fp32, but what it holds are the conv *inputs*, which are activations of the
model's dtype: a bf16 model's inputs are exact in bf16, so the snapshots of the conv streams are
stored at the activations' dtype (half the bytes of fp32, restored bit-exactly). Extra per-request
state carried with the windows (MTP's hidden states, named entries) keeps its own dtype.
"""

from __future__ import annotations

import torch

from sgl_inkling.mem_cache.memory_pool import SConvStatePool


class SConvCheckpointPool:
    """`size` snapshots with the layout of one SConvStatePool row (every layer, all four streams)."""

    def __init__(self, size: int, like: SConvStatePool, dtype: torch.dtype = torch.float32):
        self.size = size
        self.live = like
        self.store = {
            layer: [
                torch.zeros((size, *t.shape[1:]), dtype=dtype if isinstance(layer, int) else t.dtype, device=t.device)
                for t in ts
            ]
            for layer, ts in like.states.items()
        }
        self._free = list(range(size))

    @property
    def available(self) -> int:
        return len(self._free)

    def bytes_per_checkpoint(self) -> int:
        return sum(t[0].numel() * t.element_size() for ts in self.store.values() for t in ts)

    def take(self) -> int | None:
        """A free slot for the model to write a snapshot into; None when the pool is full."""
        return self._free.pop() if self._free else None

    def save(self, row: int) -> int | None:
        """Snapshot the live state of request slot `row`; None when the pool is full."""
        slot = self.take()
        if slot is None:
            return None
        for layer, ts in self.live.states.items():
            for dst, src in zip(self.store[layer], ts):
                dst[slot] = src[row]
        return slot

    def restore(self, slot: int, row: int) -> None:
        for layer, ts in self.live.states.items():
            for src, dst in zip(self.store[layer], ts):
                dst[row] = src[slot]

    def free(self, slot: int) -> None:
        self._free.append(slot)
