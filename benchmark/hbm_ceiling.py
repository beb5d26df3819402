"""The memory-bandwidth ceiling that decode floors are measured against, for the card a run is on.

BENCHMARKS.md fixes 4.3 TB/s on the H200: the rate at which a batch-1 BF16 linear [1, 8192] x
[8192, 28672] streams its weight there (90% of the card's 4.8 TB/s). The device machine may lend an
H100 instead, whose HBM is about 30% slower: there the ceiling is timed in the run, as the faster of
that linear and a plain read of 1 GiB (a sum), since on the H100 cuBLAS streams that linear at only
86% of the 3.35 TB/s datasheet figure and the fused MoE outran it. Every JSON records what it used.
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
    best = max(_linear_tb_s(), _read_tb_s())
    torch.cuda.empty_cache()
    return best


def _linear_tb_s() -> float:
    import torch

    w = torch.randn(28672, 8192, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(1, 8192, dtype=torch.bfloat16, device="cuda")
    return _stream_tb_s(lambda: x @ w.t(), w.numel() * 2)


def _read_tb_s() -> float:
    import torch

    r = torch.randn(2**29, dtype=torch.bfloat16, device="cuda")
    return _stream_tb_s(lambda: r.sum(dtype=torch.float32), r.numel() * 2)


def _stream_tb_s(fn, nbytes: int, calls: int = 20, repeats: int = 5) -> float:
    """nbytes over the median time of one fn() (each repeat times `calls` back-to-back launches; the
    operands are far larger than the L2)."""
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return nbytes / statistics.median(times) / 1e9
