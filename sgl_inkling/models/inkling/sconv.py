"""Short convolution: depthwise causal conv (kernel K) with an internal residual, computed in fp32.

y_t = x_t + sum_j w[j] * x_{t-(K-1)+j}. Its state per sequence is the last K-1 inputs; a fresh
sequence (no cached prefix) starts from zeros.
"""

from __future__ import annotations

import torch
from torch import nn

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling_kernels._triton import use_triton
from sgl_inkling_kernels.sconv import sconv_decode, sconv_extend


class ShortConv(nn.Module):
    def __init__(self, channels: int, kernel_size: int, layer_id: int, stream: int):
        super().__init__()
        # Hub layout [C, 1, K]; kept in fp32 whatever the model dtype.
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel_size, dtype=torch.float32))
        self.layer_id = layer_id
        self.stream = stream

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        state = batch.sconv_pool.state(self.layer_id, self.stream)  # [slots, K-1, C]
        if batch.mode is not ForwardMode.DECODE and batch.sconv_snapshots:
            _snapshot(x, state, batch, self.layer_id, self.stream)  # before the state moves on
        if batch.sconv_capture is not None and self.layer_id in batch.sconv_capture:
            _capture(x, state, batch, batch.sconv_capture[self.layer_id][self.stream])
        if use_triton(x):
            if batch.mode is ForwardMode.DECODE:
                return sconv_decode(x, self.weight, state, batch.req_pool_indices)
            return sconv_extend(
                x, self.weight, state, batch.req_pool_indices, batch.prefix_lens, batch.extend_lens
            )
        w = self.weight.float()[:, 0, :].t()  # [K, C]
        xf = x.float()
        if batch.mode is ForwardMode.DECODE:
            y = _decode(xf, w, state, batch.req_pool_indices)
        else:
            y = _extend(xf, w, state, batch)
        return y.to(x.dtype)


def _conv(window: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    """Outputs for the last n rows of `window` ([n + K - 1, C]), residual included."""
    k = w.shape[0]
    acc = window[0:n] * w[0]
    for j in range(1, k):
        acc = acc + window[j : j + n] * w[j]
    return window[k - 1 :] + acc


def _extend(x: torch.Tensor, w: torch.Tensor, state: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    out = torch.empty_like(x)
    width = state.shape[1]
    offset = 0
    # One token on a cached prefix is a decode (mixed chunked prefill carries one per running request):
    # those go through _decode together, whose arithmetic is _conv's for n = 1, bit for bit.
    singles: list[tuple[int, int]] = []
    for row, prefix, n in zip(batch.rows_cpu(), batch.prefix_lens_cpu, batch.extend_lens_cpu):
        if n == 1 and prefix > 0:
            singles.append((offset, row))
        else:
            prev = state[row] if prefix > 0 else x.new_zeros(width, x.shape[1])
            window = torch.cat([prev, x[offset : offset + n]], dim=0)
            out[offset : offset + n] = _conv(window, w, n)
            state[row] = window[-width:]
        offset += n
    if singles:
        at, rows = (torch.tensor(v, device=x.device) for v in zip(*singles))
        out[at] = _decode(x[at], w, state, rows)
    return out


def _snapshot(x: torch.Tensor, state: torch.Tensor, batch: ForwardBatch, layer: int, stream: int) -> None:
    """Checkpoints for the prefix cache: the conv state after j new tokens of a sequence is its last
    K-1 inputs, which the chunk already holds, so snapshots anywhere inside an extend are free."""
    width = state.shape[1]
    store = batch.sconv_checkpoints.store[layer][stream]
    starts = [0]
    for n in batch.extend_lens_cpu:
        starts.append(starts[-1] + n)
    rows = batch.rows_cpu()
    for i, snaps in batch.sconv_snapshots.items():
        if not snaps:
            continue
        prev = (
            state[rows[i]]
            if batch.prefix_lens_cpu[i] > 0
            else x.new_zeros(width, x.shape[1], dtype=state.dtype)
        )
        window = torch.cat(
            [prev, x[starts[i] : starts[i + 1]].to(state.dtype)], dim=0
        )  # row r: position prefix-width+r
        for j, slot in snaps:
            store[slot] = window[j : j + width]


def _capture(x: torch.Tensor, state: torch.Tensor, batch: ForwardBatch, out: torch.Tensor) -> None:
    """Write each sequence's window (prior state, then its new inputs) into out[row] (MTP rollback)."""
    width = state.shape[1]
    lens = set(batch.extend_lens_cpu)
    if len(lens) == 1:  # verify batches: every sequence brings K + 1 tokens; no host sync (CUDA graphs)
        n, rows = lens.pop(), batch.req_pool_indices
        live = (batch.prefix_lens > 0)[:, None, None]
        out[rows, :width] = torch.where(live, state[rows], torch.zeros((), dtype=out.dtype, device=out.device))
        out[rows, width : width + n] = x.view(rows.shape[0], n, -1).to(out.dtype)
        return
    rows = batch.rows_cpu()
    offset = 0
    for row, prefix, n in zip(rows, batch.prefix_lens_cpu, batch.extend_lens_cpu):
        if prefix > 0:
            out[row, :width] = state[row]
        else:
            out[row, :width] = 0
        out[row, width : width + n] = x[offset : offset + n].to(out.dtype)
        offset += n


def _decode(x: torch.Tensor, w: torch.Tensor, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    window = torch.cat([state[rows], x[:, None, :]], dim=1)  # [B, K, C]
    k = w.shape[0]
    acc = window[:, 0] * w[0]
    for j in range(1, k):
        acc = acc + window[:, j] * w[j]
    state[rows] = window[:, 1:]
    return x + acc
