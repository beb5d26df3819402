"""Which slice of a hub tensor a rank holds. Modules declare it; the loader and dummy init apply it.

A parameter's layout is a tuple of `Shard`s: along `dim`, the tensor is cut into `parts` equal
chunks and this rank holds chunk `part`. Declaring it on the module (not the Parameter) survives
`to_empty`, which replaces parameter objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sgl_inkling.distributed.parallel_state import ParallelState


@dataclass(frozen=True)
class Shard:
    dim: int
    part: int
    parts: int


def declare(module: nn.Module, param: str, *shards: Shard) -> None:
    """Record that `module.<param>` holds the given slice of the hub tensor (no-op when unsplit)."""
    shards = tuple(s for s in shards if s.parts > 1)
    if shards:
        module.__dict__.setdefault("tp_shards", {})[param] = shards


def param_shards(model: nn.Module) -> dict[str, tuple[Shard, ...]]:
    out = {}
    for prefix, mod in model.named_modules():
        for name, shards in getattr(mod, "tp_shards", {}).items():
            out[f"{prefix}.{name}" if prefix else name] = shards
    return out


def full_shape(local: tuple[int, ...], shards: tuple[Shard, ...]) -> tuple[int, ...]:
    shape = list(local)
    for s in shards:
        shape[s.dim] *= s.parts
    return tuple(shape)


def slices(full: tuple[int, ...], shards: tuple[Shard, ...]) -> tuple[slice, ...]:
    """Index that takes this rank's chunk out of a tensor of the `full` shape."""
    idx = [slice(None)] * len(full)
    for s in shards:
        n = full[s.dim] // s.parts
        idx[s.dim] = slice(s.part * n, (s.part + 1) * n)
    return tuple(idx)


def take(tensor: torch.Tensor, shards: tuple[Shard, ...]) -> torch.Tensor:
    return tensor[slices(tuple(tensor.shape), shards)]


def split(n: int, p: ParallelState, what: str) -> Shard:
    """Split n units (heads, channels) over the TP ranks on dim 0."""
    if n % p.tp_size:
        raise ValueError(f"--tp-size {p.tp_size} must divide the {what} ({n})")
    return Shard(0, p.tp_rank, p.tp_size)


def split_kv_heads(n: int, p: ParallelState) -> Shard:
    """KV heads: split when the TP size divides them, else each rank holds the one head its query
    heads read (tp_size / n ranks replicate it)."""
    if n % p.tp_size == 0:
        return Shard(0, p.tp_rank, p.tp_size)
    if p.tp_size % n == 0:
        return Shard(0, p.tp_rank * n // p.tp_size, n)
    raise ValueError(f"--tp-size {p.tp_size} neither divides nor is a multiple of the KV heads ({n})")


def on_dim(shard: Shard, dim: int) -> Shard:
    return Shard(dim, shard.part, shard.parts)


def local(n: int, shard: Shard) -> int:
    return n // shard.parts
