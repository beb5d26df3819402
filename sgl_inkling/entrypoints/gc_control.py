"""Python's cyclic garbage collector in the serving processes.

A full (generation 2) collection walks every tracked object. After start-up a scheduler process
holds about 356K of them (modules, the model's parameters and buffers, torch and library state)
and a full collection took 235-320 ms on a CPU, a pause the GPU waits for whenever the serving
loop's allocations trigger one (rarely: none in 190 decode steps at batch 64 on the CPU; a long
run gets some). Everything alive at the end of start-up lives until exit, so each process
collects once and freezes it (gc.freeze: moved to a permanent generation the collector never
walks again), as vLLM does after start-up and SGLang offers with its freeze_gc call; a full
collection then walks only what serving itself keeps (0 ms frozen, on the same CPU).
--gc-warning-threshold-secs (upstream's flag) logs any collection longer than that.
"""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger(__name__)


def freeze_after_startup(process: str) -> int:
    """Collect, then freeze every object alive now. Returns the number frozen."""
    gc.collect()
    gc.freeze()
    n = gc.get_freeze_count()
    logger.info("%s: froze %d objects alive after start-up out of the garbage collector's walks", process, n)
    return n


def warn_long_collections(threshold_s: float, process: str) -> None:
    """Log a warning for every collection longer than threshold_s (0: none)."""
    if threshold_s <= 0:
        return
    started: dict[int, float] = {}

    def callback(phase: str, info: dict) -> None:
        gen = info.get("generation", -1)
        if phase == "start":
            started[gen] = time.perf_counter()
            return
        took = time.perf_counter() - started.pop(gen, time.perf_counter())
        if took > threshold_s:
            logger.warning("%s: garbage collection of generation %d took %.3f s (%d objects tracked)",
                           process, gen, took, len(gc.get_objects(gen)))  # fmt: skip

    gc.callbacks.append(callback)
