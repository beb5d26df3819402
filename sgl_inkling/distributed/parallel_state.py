"""Who this process is in the tensor-parallel group, read by the model's modules when they are built.

One global state, like SGLang's: the modules ask for their shard at construction, so the model code
keeps its signatures and TP 1 (the default) costs nothing. Expert parallelism splits the routed
experts of the same group into `ep_size` sets; each set is further split over the
`tp_size // ep_size` ranks that share it (on the experts' intermediate dimension).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Followers block in a broadcast while the server is idle: never let that time out.
_LONG_TIMEOUT = dt.timedelta(days=365)


@dataclass(frozen=True)
class ParallelState:
    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1
    group: Any = None  # device collectives (NCCL on cuda, gloo on cpu)
    cpu_group: Any = None  # gloo, for Python objects (scheduler broadcasts)

    @property
    def moe_tp_size(self) -> int:
        return self.tp_size // self.ep_size

    @property
    def moe_tp_rank(self) -> int:
        return self.tp_rank % self.moe_tp_size

    @property
    def ep_rank(self) -> int:
        return self.tp_rank // self.moe_tp_size


_STATE = ParallelState()


def get_parallel() -> ParallelState:
    return _STATE


def set_parallel(state: ParallelState) -> None:
    global _STATE
    _STATE = state


def init_distributed(
    tp_size: int, tp_rank: int, ep_size: int, init_method: str, device: str, local_rank: int = 0
) -> ParallelState:
    """Join the TP group (world = TP group: data parallelism runs separate launches) and set the state."""
    if tp_size % ep_size:
        raise ValueError(f"--ep-size {ep_size} must divide --tp-size {tp_size}")
    if tp_size == 1:
        set_parallel(ParallelState())
        return _STATE
    on_cuda = device.startswith("cuda")
    if on_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        "nccl" if on_cuda else "gloo",
        init_method=init_method,
        rank=tp_rank,
        world_size=tp_size,
        timeout=_LONG_TIMEOUT,
    )
    group = dist.group.WORLD
    cpu_group = dist.new_group(backend="gloo", timeout=_LONG_TIMEOUT) if on_cuda else group
    set_parallel(ParallelState(tp_size, tp_rank, ep_size, group, cpu_group))
    return _STATE


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    set_parallel(ParallelState())
