"""The conv windows MTP captures for rollback, and the rollback itself.

A forward with `sconv_capture` set writes, per layer and stream, each request's window (the prior
conv state, then the stream's inputs) into that stream's buffer [rows, K-1 + tokens, C]; the state
after the first n tokens is rows n..n+K-2 of it. The windows of a group of consecutive layers are
channel slices of one fp32 buffer laid out as the live states are in SConvStatePool's buffer, so
rolling a group (or a run of its layers) back is one launch on the GPU (conv_rollback): draft and
verify steps are latency-bound (about 2 us a launch, in a CUDA graph too), and a gather and a store
per layer and stream were some 330 launches a step at 66 trunk layers. The torch path (CPU) goes
layer by layer, which bounds its temporary to one layer's window.
"""

from __future__ import annotations

import torch

from sgl_inkling.mem_cache.memory_pool import SConvStatePool
from sgl_inkling_kernels._triton import use_triton
from sgl_inkling_kernels.conv_rollback import conv_rollback


class ConvWindows(dict):
    """Layer id -> its streams' window buffers (what ForwardBatch.sconv_capture takes)."""

    def __init__(self, pool: SConvStatePool, groups: list[list[int]], tokens: int):
        super().__init__()
        self.pool = pool
        self.width = pool.width
        self.groups: list[tuple[torch.Tensor, list[int]]] = []  # (buffer, its layers)
        for layers in groups:
            if any(pool.channels[a][1] != pool.channels[b][0] for a, b in zip(layers, layers[1:])):
                raise ValueError(f"conv windows: layers {layers} are not consecutive in the conv state pool")
            base = pool.channels[layers[0]][0]
            channels = pool.channels[layers[-1]][1] - base
            buf = torch.zeros(pool.size, pool.width + tokens, channels, device=pool.buffer.device)
            for layer in layers:
                lo = pool.channels[layer][0] - base
                self[layer] = []
                for state in pool.states[layer]:
                    self[layer].append(buf[..., lo : lo + state.shape[-1]])
                    lo += state.shape[-1]
            self.groups.append((buf, layers))

    def restore(self, rows: torch.Tensor, n: torch.Tensor, layers: range | None = None) -> None:
        """Each layer's conv state after the first n[i] tokens of its captured window; only `layers`
        when given (the others' windows were not written: MTP depths that did not run)."""
        channels = self.pool.channels
        for buf, group in self.groups:
            run = [layer for layer in group if layers is None or layer in layers]
            if not run:
                continue
            base = channels[group[0]][0]
            if use_triton(buf):
                lo, hi = channels[run[0]][0], channels[run[-1]][1]
                conv_rollback(buf[..., lo - base : hi - base], self.pool.buffer[..., lo:hi], rows, n)
                continue
            idx = n[:, None] + torch.arange(self.width, device=n.device)  # [B, K-1]
            for layer in run:
                lo, hi = channels[layer]
                self.pool.buffer[..., lo:hi][rows] = buf[rows[:, None], idx, lo - base : hi - base]
