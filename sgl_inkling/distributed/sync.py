"""Agreement between TP ranks on host-side values (over the gloo group, never the device)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from sgl_inkling.distributed.parallel_state import get_parallel

T = TypeVar("T")


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (the others pass anything)."""
    p = get_parallel()
    if p.tp_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=p.cpu_group)
    return box[0]


def min_over_ranks(sizes: T) -> T:
    """Field-wise minimum of an int dataclass: pools sized from each GPU's free memory must agree,
    or the ranks would admit different batches."""
    p = get_parallel()
    if p.tp_size == 1:
        return sizes
    names = [f.name for f in dataclasses.fields(sizes)]
    t = torch.tensor([getattr(sizes, n) for n in names], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=p.cpu_group)
    return dataclasses.replace(sizes, **dict(zip(names, t.tolist())))


def gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    p = get_parallel()
    if p.tp_size == 1:
        return [obj]
    out: list[Any] = [None] * p.tp_size
    dist.all_gather_object(out, obj, group=p.cpu_group)
    return out
