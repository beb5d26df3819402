"""Short convolution: depthwise causal conv (kernel K) with an internal residual, computed in fp32.

y_t = x_t + sum_j w[j] * x_{t-(K-1)+j}. Its state per sequence is the last K-1 inputs; a fresh
sequence (no cached prefix) starts from zeros.
"""

from __future__ import annotations

import torch
from torch import nn

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.sampling.host_copy import to_device
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
        decode = batch.mode is ForwardMode.DECODE
        if not decode and batch.sconv_snapshots:
            _snapshot(x, state, batch, self.layer_id, self.stream)  # before the state moves on
        capture = capture_window(batch, self.layer_id, self.stream, state.shape[1])
        if capture is not None and (decode or not use_triton(x)):
            _capture(x, state, batch, capture)
            capture = None
        if use_triton(x):
            if decode:
                return sconv_decode(x, self.weight, state, batch.req_pool_indices)
            # The extend kernel writes MTP's window itself (4 launches a stream fewer in verify and draft steps).
            return sconv_extend(
                x, self.weight, state, batch.req_pool_indices, batch.prefix_lens, batch.extend_lens,
                q_start=batch.extend_starts(), capture=capture,
            )
        w = self.weight.float()[:, 0, :].t()  # [K, C]
        xf = x.float()
        if batch.mode is ForwardMode.DECODE:
            y = _decode(xf, w, state, batch.req_pool_indices)
        else:
            y = _extend(xf, w, state, batch)
        return y.to(x.dtype)


def capture_window(batch: ForwardBatch, layer_id: int, stream: int, width: int) -> torch.Tensor | None:
    """MTP's window buffer [rows, width + tokens, C] for this layer and stream when the batch captures
    them, else None; a batch bringing more tokens a sequence than the buffer holds is refused."""
    if batch.sconv_capture is None or layer_id not in batch.sconv_capture:
        return None
    capture = batch.sconv_capture[layer_id][stream]
    if batch.max_extend_len() > capture.shape[1] - width:
        raise ValueError(f"MTP conv capture holds {capture.shape[1] - width} tokens, the batch "
                         f"brings {batch.max_extend_len()}")  # fmt: skip
    return capture


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
    K-1 inputs, which the chunk already holds, so snapshots anywhere inside an extend are free.

    Snapshot (j, slot) of sequence i is rows [j, j + K-1) of its window: the prior state (K-1 rows,
    zeros without a cached prefix) followed by the chunk's inputs. All of a batch's snapshots are
    one gather per stream (an 8K-token chunk takes 64 at the default interval: a copy each per
    stream was ~900 kernels and ~3 ms of an 8K prefill step on the H200, and the whole chunk was
    widened to fp32 to take them)."""
    index = snapshot_index(batch, state.shape[1], x.device)
    if index is None:
        return
    slots, rows, at_state, at_x, from_state, zero = index
    width = state.shape[1]
    values = torch.where(from_state[:, None], state[rows, at_state], x[at_x].to(state.dtype))
    values = values.masked_fill(zero[:, None], 0)
    store = batch.sconv_checkpoints.store[layer][stream]
    store[slots] = values.view(slots.numel(), width, -1).to(store.dtype)


def snapshot_index(batch: ForwardBatch, width: int, device: torch.device):
    """The batch's snapshots as device index tensors, built once per forward (every layer and stream
    shares them): checkpoint slots [N]; then per window row (N * width): the request row and state
    row it reads when it lies in the prior state, the token it reads otherwise, whether it is in the
    prior state, and whether that state is zeros (no cached prefix). None when there are none."""
    cache = batch.snapshot_index_cache
    if width in cache:
        return cache[width]
    rows = batch.rows_cpu()
    starts = [0]
    for n in batch.extend_lens_cpu:
        starts.append(starts[-1] + n)
    slots, req_rows, at_state, at_x, from_state, zero = [], [], [], [], [], []
    for i, snaps in batch.sconv_snapshots.items():
        cached = batch.prefix_lens_cpu[i] > 0
        for j, slot in snaps:
            slots.append(slot)
            for q in range(j, j + width):  # window row q
                prior = q < width
                req_rows.append(rows[i])
                at_state.append(q if prior else 0)
                at_x.append(starts[i] if prior else starts[i] + q - width)
                from_state.append(prior and cached)
                zero.append(prior and not cached)
    if not slots:
        cache[width] = None
        return None
    n = len(req_rows)
    flat = to_device(slots + req_rows + at_state + at_x + from_state + zero, torch.int64, device)
    parts = [flat[: len(slots)]] + list(flat[len(slots) :].view(5, n).unbind(0))
    cache[width] = (*parts[:4], parts[4].bool(), parts[5].bool())
    return cache[width]


def _capture(x: torch.Tensor, state: torch.Tensor, batch: ForwardBatch, out: torch.Tensor) -> None:
    """Write each sequence's window (prior state, then its new inputs) into out[row] (MTP rollback)."""
    width = state.shape[1]
    lens = set(batch.extend_lens_cpu)
    if len(lens) == 1:  # verify and draft batches: every sequence brings n tokens; no host sync (CUDA graphs)
        n, rows = lens.pop(), batch.req_pool_indices
        b = rows.shape[0]
        # The window assembled in one buffer (prior state gathered straight into it, the inputs
        # converted into it) and stored with one index_put: 3 launches a stream in a draft step,
        # 5 with the mask (were 6-7: a gather, a mask, a zeros fill, a where, a copy, two index_puts).
        window = out.new_empty(b, width + n, out.shape[-1])
        if state.dtype == out.dtype:
            torch.index_select(state, 0, rows, out=window[:, :width])
        else:
            window[:, :width] = state[rows]
        if not batch.prefixes_cached:
            window[:, :width].masked_fill_((batch.prefix_lens <= 0)[:, None, None], 0)  # fresh: zeros
        window[:, width:].copy_(x.view(b, n, -1))
        out[rows, : width + n] = window
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
