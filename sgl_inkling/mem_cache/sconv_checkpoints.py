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
    """`size` snapshots with the layout of one SConvStatePool row (every layer, all four streams): the
    conv streams as one buffer laid out as the pool's, so a save or restore is one copy for them
    (not one per layer and stream: 264 launches at 66 layers), then one per extra named state."""

    def __init__(self, size: int, like: SConvStatePool, dtype: torch.dtype = torch.float32):
        self.size = size
        self.live = like
        self.conv = torch.zeros((size, *like.buffer.shape[1:]), dtype=dtype, device=like.buffer.device)
        self.extra = [name for name in like.states if not isinstance(name, int)]
        self.store: dict = {}  # layer (or extra state's name) -> per-stream views of the snapshots
        for layer, ts in like.states.items():
            if layer in self.extra:
                self.store[layer] = [torch.zeros((size, *t.shape[1:]), dtype=t.dtype, device=t.device) for t in ts]
                continue
            lo, self.store[layer] = like.channels[layer][0], []
            for t in ts:
                self.store[layer].append(self.conv[..., lo : lo + t.shape[-1]])
                lo += t.shape[-1]
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
        self.conv[slot] = self.live.buffer[row]
        for name in self.extra:
            for dst, src in zip(self.store[name], self.live.states[name]):
                dst[slot] = src[row]
        return slot

    def restore(self, slot: int, row: int) -> None:
        self.live.buffer[row] = self.conv[slot]
        for name in self.extra:
            for src, dst in zip(self.store[name], self.live.states[name]):
                dst[row] = src[slot]

    def free(self, slot: int) -> None:
        self._free.append(slot)
