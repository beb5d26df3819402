"""Short convolution: depthwise causal conv (kernel K) with an internal residual, computed in fp32.

y_t = x_t + sum_j w[j] * x_{t-(K-1)+j}. Its state per sequence is the last K-1 inputs; a fresh
sequence (no cached prefix) starts from zeros.
"""

from __future__ import annotations

import torch
from torch import nn

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode


class ShortConv(nn.Module):
    def __init__(self, channels: int, kernel_size: int, layer_id: int, stream: int):
        super().__init__()
        # Hub layout [C, 1, K]; kept in fp32 whatever the model dtype.
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel_size, dtype=torch.float32))
        self.layer_id = layer_id
        self.stream = stream

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        state = batch.sconv_pool.state(self.layer_id, self.stream)  # [slots, K-1, C]
        w = self.weight.float()[:, 0, :].t()  # [K, C]
        xf = x.float()
        if batch.mode is ForwardMode.DECODE:
            y = _decode(xf, w, state, batch.req_pool_indices)
        else:
            y = _extend(xf, w, state, batch, self.layer_id, self.stream)
        return y.to(x.dtype)


def _conv(window: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    """Outputs for the last n rows of `window` ([n + K - 1, C]), residual included."""
    k = w.shape[0]
    acc = window[0:n] * w[0]
    for j in range(1, k):
        acc = acc + window[j : j + n] * w[j]
    return window[k - 1 :] + acc


def _extend(
    x: torch.Tensor, w: torch.Tensor, state: torch.Tensor, batch: ForwardBatch, layer: int, stream: int
) -> torch.Tensor:
    out = torch.empty_like(x)
    width = state.shape[1]
    offset = 0
    rows = batch.req_pool_indices.tolist()
    for i, (row, prefix, n) in enumerate(zip(rows, batch.prefix_lens_cpu, batch.extend_lens_cpu)):
        prev = state[row] if prefix > 0 else x.new_zeros(width, x.shape[1])
        window = torch.cat([prev, x[offset : offset + n]], dim=0)  # row r holds position prefix - width + r
        out[offset : offset + n] = _conv(window, w, n)
        state[row] = window[-width:]
        # The conv state after j tokens is just window[j : j + width]: checkpoints anywhere are free.
        for j, slot in batch.sconv_snapshots.get(i, ()):
            batch.sconv_checkpoints.store[layer][stream][slot] = window[j : j + width]
        offset += n
    return out


def _decode(x: torch.Tensor, w: torch.Tensor, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    window = torch.cat([state[rows], x[:, None, :]], dim=1)  # [B, K, C]
    k = w.shape[0]
    acc = window[:, 0] * w[0]
    for j in range(1, k):
        acc = acc + window[:, j] * w[j]
    state[rows] = window[:, 1:]
    return x + acc
