"""Last-arrival counters: a launch whose programs each write a partial result lets its last program
combine them, instead of a second launch to do it. In a decode step replayed from a CUDA graph each
launch boundary costs about 1 us on the H200 (the next kernel waits for the last program of this one
to drain, then starts). It pays where the combining is short (decode attention's merge of a few
splits); where it is long for one program (an RMSNorm of a whole 6144-wide row: 4.1 against 3.3 us
at batch 1), the second launch's parallel programs win.

Protocol: a counter is an int32 that is zero at rest. Each program of a group stores its partials,
then `arrive` adds one (acq_rel at GPU scope, after a barrier, so the program's stores are visible
to whoever sees the count). The program that sees n - 1 is the last: its loads after `arrive` see
every partial of the group, and it resets the counter for the next launch. No host work, no memset:
the same pointer serves every launch and every graph replay.

The counters of one device are one zeroed buffer, allocated once outside CUDA-graph capture (the
launchers' warm-up calls run first) and never freed, so a captured graph's pointer stays valid.
One user today (decode attention, one counter per sequence and KV head); kernels on one stream run
one after another, so they may share it. A second user that can run beside it on another stream
needs counters of its own.
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import tl, triton

CAPACITY = 1 << 14  # counters a device holds: batch x KV heads of decode attention fits easily

_BUFFERS: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device, n: int) -> torch.Tensor:
    """The first n of `device`'s zeroed int32 counters (the same ones on every call)."""
    if n > CAPACITY:
        raise ValueError(f"arrivals: {n} counters asked for, a device holds {CAPACITY}")
    buf = _BUFFERS.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("arrivals: first use during CUDA-graph capture; warm the kernel up before capturing")
        buf = _BUFFERS[device] = torch.zeros(CAPACITY, dtype=torch.int32, device=device)
    return buf[:n]


@triton.jit
def arrive(Counter, n):
    """True in the last of the n programs sharing Counter to arrive (which resets it); call after the
    program's partial stores. Every thread of the program gets the same answer."""
    tl.debug_barrier()  # every thread's partial stores issued before the count is published
    seen = tl.atomic_add(Counter, 1, sem="acq_rel", scope="gpu")
    last = seen == n - 1
    if last:
        tl.atomic_xchg(Counter, 0, sem="relaxed", scope="gpu")
    return last
