"""Host lists to device tensors without stalling the host.

A plain `torch.tensor(values).to("cuda")` copies from pageable memory and waits for the copy, so
the host blocks until every kernel queued before it (e.g. the forward pass) has finished. Staging
in pinned memory makes the copy asynchronous and stream-ordered: kernels queued after it see the
values, and the host keeps queueing work. The caching host allocator keeps the pinned block alive
until the copy is done.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

_waited = 0.0  # seconds HostCopy.wait blocked the host: the decode log's share of time waiting on the device


def take_waited() -> float:
    """Seconds the host spent blocked in HostCopy.wait since the last call."""
    global _waited
    out, _waited = _waited, 0.0
    return out


def to_device(values: Sequence | torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`values` (a host list, or a tensor on any device) as a `dtype` tensor on `device`."""
    device = torch.device(device)
    if isinstance(values, torch.Tensor) and values.device.type != "cpu":
        return values.to(device, dtype)  # already on a device: no host round trip
    t = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class HostCopy:
    """Device tensors copied into pinned host memory behind the work queued so far, without waiting:
    wait() blocks until the copies (and so everything queued before them) are done, then gives the
    host tensors. On the CPU the tensors are already there and nothing waits."""

    def __init__(self, tensors: Sequence[torch.Tensor | None]):
        self._done: torch.cuda.Event | None = None
        self._host = [None if t is None else self._start(t) for t in tensors]
        if self._done is not None:
            self._done.record()

    def _start(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cuda":
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        self._done = self._done or torch.cuda.Event()
        return host

    def wait(self) -> list[torch.Tensor | None]:
        global _waited
        if self._done is not None:
            t = time.perf_counter()
            self._done.synchronize()
            _waited += time.perf_counter() - t
        return self._host
