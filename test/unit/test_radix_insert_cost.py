"""A finished request's insert walks its cached path once, whatever the number of checkpoint nodes on
it: on the real geometry (window 512, a checkpoint every 128 tokens) an 8K-token prompt's path has
64 nodes, and absorbing the request's slots node by node cost 13x the insert over a one-node path of
the same length (2.3 ms against 0.18 on this project's CPU machine); one pass over the path, about 2x.
Time ratios of two inserts run together, so the machine's speed cancels."""

from __future__ import annotations

import time

import torch

from sgl_inkling.mem_cache.memory_pool import SConvStatePool, TokenSlotAllocator
from sgl_inkling.mem_cache.radix_cache import RadixCache
from sgl_inkling.mem_cache.sconv_checkpoints import SConvCheckpointPool

WINDOW, INTERVAL, PROMPT, OUTPUT = 512, 128, 8192, 1024


def finish_insert_seconds(nodes: int) -> float:
    """Cache an 8K prompt's path with `nodes` checkpoint nodes, then time the insert of the finished
    request (prompt + output, its own window's sliding slots at the end) over it."""
    live = SConvStatePool(2, {0: (2, 2, 3, 3)}, 4, "cpu")
    cache = RadixCache(TokenSlotAllocator(40_000), TokenSlotAllocator(40_000), SConvCheckpointPool(200, live), WINDOW)
    n = PROMPT + OUTPUT
    tokens = torch.randint(0, 199_990, (n,), generator=torch.Generator().manual_seed(nodes)).tolist()
    full, swa = cache.full_alloc.alloc(n), torch.zeros(n, dtype=torch.int64)

    def window_before(p: int) -> None:
        lo = max(0, p - WINDOW + 1)
        need = (swa[lo:p] == 0).nonzero().flatten() + lo
        swa[need] = cache.swa_alloc.alloc(need.numel())

    step = PROMPT // nodes
    inner = {p: cache.ckpts.take() for p in range(step, PROMPT, step)}
    for p in [*inner, PROMPT]:
        window_before(p)
    cache.insert(tokens[:PROMPT], full[:PROMPT], swa[:PROMPT].clone(), cache.ckpts.take(), inner)
    window_before(n)
    t = time.perf_counter()
    end = cache.insert(tokens, full, swa, cache.ckpts.take())
    took = time.perf_counter() - t
    assert end.end == n and torch.equal(cache.slots_of(end)[0], full)  # the path holds the request's slots
    return took


def test_a_finished_request_absorbs_its_cached_path_in_one_pass():
    for _ in range(2):  # warm-up
        finish_insert_seconds(PROMPT // INTERVAL)
    many = min(finish_insert_seconds(PROMPT // INTERVAL) for _ in range(7))
    one = min(finish_insert_seconds(1) for _ in range(7))
    assert many < 6 * one, f"64 checkpoint nodes {many * 1e3:.2f} ms against one node {one * 1e3:.2f} ms"
