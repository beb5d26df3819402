"""Shard layouts: which query and KV heads a TP rank holds, and slicing by declared shards."""

from __future__ import annotations

import pytest
import torch

from sgl_inkling.distributed.parallel_state import ParallelState
from sgl_inkling.distributed.sharding import Shard, full_shape, local, split, split_kv_heads, take


@pytest.mark.parametrize("heads, kv, tp", [(64, 8, 2), (64, 8, 8), (64, 8, 16), (64, 16, 32), (4, 2, 4), (4, 4, 2)])
def test_each_rank_holds_the_kv_heads_its_query_heads_read(heads, kv, tp):
    group = heads // kv  # query heads per KV head (GQA)
    holders = {}
    for rank in range(tp):
        p = ParallelState(tp_size=tp, tp_rank=rank)
        q, k = split(heads, p, "heads"), split_kv_heads(kv, p)
        q_ids = range(q.part * local(heads, q), (q.part + 1) * local(heads, q))
        kv_ids = list(range(k.part * local(kv, k), (k.part + 1) * local(kv, k)))
        # Local query head i reads local KV head i // (local group), as the attention backends assume.
        local_group = local(heads, q) // len(kv_ids)
        for i, g in enumerate(q_ids):
            assert kv_ids[i // local_group] == g // group
        for h in kv_ids:
            holders.setdefault(h, []).append(rank)
    assert sorted(holders) == list(range(kv))  # every KV head is held somewhere...
    assert {len(r) for r in holders.values()} == {max(1, tp // kv)}  # ...replicated only past their count


def test_sizes_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="attention heads"):
        split(64, ParallelState(tp_size=3), "attention heads")
    with pytest.raises(ValueError, match="KV heads"):
        split_kv_heads(8, ParallelState(tp_size=12))


def test_take_and_full_shape_invert_each_other():
    w = torch.arange(4 * 6 * 8).view(4, 6, 8)
    shards = (Shard(0, 1, 2), Shard(2, 3, 4))
    part = take(w, shards)
    assert part.shape == (2, 6, 2) and full_shape(tuple(part.shape), shards) == (4, 6, 8)
    assert torch.equal(part, w[2:4, :, 6:8])
