"""The memory-bandwidth ceiling that decode floors are measured against, for the card a run is on.

BENCHMARKS.md fixes 4.3 TB/s on the H200: the rate at which a batch-1 BF16 linear [1, 8192] x
[8192, 28672] streams its weight there. The device machine may lend an H100 instead, whose HBM is
about 30% slower: there the same linear is timed in the run and its rate is the ceiling, so that
"fraction of the floor" means the same thing on either card. Every JSON records the value it used.
"""

from __future__ import annotations

import functools
import statistics

H200_TB_S = 4.3  # BENCHMARKS.md, measured on the H200 test machine


@functools.cache
def peak_tb_s() -> float:
    """TB/s for this process's GPU (H200: the documented 4.3; other cards: the reference linear timed
    now), or 4.3 where there is no GPU (CPU runs quote ratios, not fractions)."""
    import torch

    if not torch.cuda.is_available() or "H200" in torch.cuda.get_device_name():
        return H200_TB_S
    return reference_linear_tb_s()


def reference_linear_tb_s(calls: int = 20, repeats: int = 5) -> float:
    """The BENCHMARKS.md linear on this GPU: its weight's bytes over the median time of a call, each
    repeat timing `calls` back-to-back launches (470 MB of weight: nothing stays in L2)."""
    import torch

    w = torch.randn(28672, 8192, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(1, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        x @ w.t()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            x @ w.t()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    nbytes = w.numel() * w.element_size()
    del w
    torch.cuda.empty_cache()
    return nbytes / statistics.median(times) / 1e9
