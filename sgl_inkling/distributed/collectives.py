"""Collectives over the TP group on the hidden dimension, with optional timing for benchmarks.

The attention and FFN outputs are partial sums on every rank. Instead of an all-reduce, a
reduce-scatter hands rank r the summed channels [r*H/tp, (r+1)*H/tp): the output short conv runs
on that shard (its state lives there), and an all-gather rebuilds the full hidden before the
residual add. Same bytes on the wire as one all-reduce; the conv work and state divide by tp.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from sgl_inkling.distributed.parallel_state import get_parallel


class CommTimer:
    """Marks around every collective (CUDA events on the GPU: no host sync while recording)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.spans: list[tuple[str, object, object]] = []

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def run(self, name: str, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        a = self._mark()
        out = fn()
        self.spans.append((name, a, self._mark()))
        return out

    def total_ms(self) -> dict[str, float]:
        """Per collective name, the summed time of the spans recorded so far (syncs the GPU)."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for name, a, b in self.spans:
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            out[name] = out.get(name, 0.0) + ms
        return out


timer: CommTimer | None = None  # set by benchmarks

# torch 2.13 renamed the single-tensor collectives; the GPU machine's 2.11 has only the old names.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _run(name: str, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    return fn() if timer is None else timer.run(name, fn)


def reduce_scatter_hidden(x: torch.Tensor) -> torch.Tensor:
    """[T, H] partial sums -> [T, H/tp]: this rank's channels of the sum."""
    p = get_parallel()
    if p.tp_size == 1:
        return x
    t, h = x.shape
    chunks = x.view(t, p.tp_size, h // p.tp_size).transpose(0, 1).contiguous()  # [tp, T, H/tp]
    out = x.new_empty(t, h // p.tp_size)

    def rs() -> torch.Tensor:
        _reduce_scatter(out, chunks.view(p.tp_size * t, -1), group=p.group)
        return out

    return _run("reduce_scatter", rs)


def all_gather_hidden(x: torch.Tensor) -> torch.Tensor:
    """[T, H/tp] channel shards -> [T, H] on every rank."""
    p = get_parallel()
    if p.tp_size == 1:
        return x
    t, hs = x.shape
    buf = x.new_empty(p.tp_size * t, hs)

    def ag() -> torch.Tensor:
        _all_gather(buf, x.contiguous(), group=p.group)
        return buf

    gathered = _run("all_gather", ag)
    return gathered.view(p.tp_size, t, hs).transpose(0, 1).reshape(t, p.tp_size * hs)
