"""The conv windows MTP captures for rollback, and the rollback itself.

A forward with `sconv_capture` set writes, per layer and stream, each request's window (the prior
conv state, then the stream's inputs) into that stream's buffer [rows, K-1 + tokens, C]; the state
after the first n tokens is rows n..n+K-2 of it. The streams of a group of layers are channel
slices of one fp32 buffer, so rolling a group back is one gather and then a store per stream, not
a gather and a store per stream: draft steps are latency-bound (about 2 us a launch, in a CUDA
graph too) and these copies are tiny. A group's gather is a [requests, K-1, the group's channels]
temporary, which is why a deep trunk is grouped by layer.
"""

from __future__ import annotations

import torch

from sgl_inkling.mem_cache.memory_pool import SConvStatePool


class ConvWindows(dict):
    """Layer id -> its streams' window buffers (what ForwardBatch.sconv_capture takes)."""

    def __init__(self, pool: SConvStatePool, groups: list[list[int]], tokens: int):
        super().__init__()
        self.width = pool.width
        self.groups: list[tuple[torch.Tensor, list]] = []  # (buffer, [(layer, (state, first channel, end))])
        for layers in groups:
            states = [s for layer in layers for s in pool.states[layer]]
            channels = sum(s.shape[-1] for s in states)
            buf = torch.zeros(pool.size, pool.width + tokens, channels, device=states[0].device)
            slices, lo = [], 0
            for layer in layers:
                self[layer] = []
                for state in pool.states[layer]:
                    slices.append((layer, (state, lo, lo + state.shape[-1])))
                    self[layer].append(buf[..., lo : lo + state.shape[-1]])
                    lo += state.shape[-1]
            self.groups.append((buf, slices))

    def restore(self, rows: torch.Tensor, n: torch.Tensor, layers: range | None = None) -> None:
        """Each layer's conv state after the first n[i] tokens of its captured window; only `layers`
        when given (the others' windows were not written: MTP depths that did not run)."""
        idx = n[:, None] + torch.arange(self.width, device=n.device)  # [B, K-1]
        for buf, slices in self.groups:
            window = None
            for layer, (state, lo, hi) in slices:
                if layers is not None and layer not in layers:
                    continue
                if window is None:
                    window = buf[rows[:, None], idx]
                state[rows] = window[..., lo:hi]
