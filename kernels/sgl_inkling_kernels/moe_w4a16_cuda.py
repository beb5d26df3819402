"""The decode path of fused_moe_nvfp4 on NVIDIA GPUs: W4A16 tensor-core projections in CUDA C++.

csrc/moe_w4a16_mma.cu says why and how (mma.sync fragments decoded straight from the checkpoint's
code bytes). It is JIT-built with torch's extension builder on first use (about a minute, once
per machine: the build directory is cached) and used for blocks of 8 * nt (token, slot) pairs of
one expert; the BF16 sink experts run in the same launches while the batch fits one sink block of
at most 64 tokens. Prefill (many pairs per expert) stays with the Triton MMA kernels.

Buffers are fused_moe_nvfp4's: act rows (pairs, then sink s token t at n_pairs + s * T + t) and the
[T, k + S, H] fp32 slot buffer that its slot sum reduces.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sgl_inkling_kernels.fused_moe import moe_align

logger = logging.getLogger(__name__)

SRC = Path(__file__).with_name("csrc") / "moe_w4a16_mma.cu"
CHUNK = 128  # K elements per chunk of the kernel: H and I must be multiples of it
MAX_SINK_TOKENS = 64  # one sink block holds at most 8 * 8 tokens


@dataclass(frozen=True)
class CudaTiles:
    """nt: 8-column MMA tiles per block (a block is 8 * nt pairs of one expert); depth: K chunks of
    code loads in flight per warp."""

    nt: int = 1
    depth: int = 2


@functools.cache
def _module():
    from torch.utils.cpp_extension import load

    start = time.monotonic()
    logger.info("building the CUDA NVFP4 MoE decode kernels (first use on this machine, about a minute)")
    mod = load(name="sgl_inkling_moe_w4a16", sources=[str(SRC)], extra_cuda_cflags=["-O3", "-std=c++17"],
               verbose=False)  # fmt: skip
    logger.info("CUDA NVFP4 MoE decode kernels ready in %.0f s", time.monotonic() - start)
    return mod


@functools.cache
def _has_bf16_mma(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 0)


def usable(x: torch.Tensor, hidden: int, inter: int) -> bool:
    """The kernels need a CUDA bf16 x, mma.sync bf16 (sm_80+) and H, I multiples of 128."""
    return x.is_cuda and x.dtype == torch.bfloat16 and hidden % CHUNK == 0 and inter % CHUNK == 0 \
        and _has_bf16_mma(x.device)  # fmt: skip


def build() -> None:
    """Compile now (start-up warm-up) instead of inside the first request."""
    _module()


def default_cuda_tiles(n_pairs: int, n_exp: int) -> CudaTiles:
    """Columns per block from the mean pairs per expert (blocks padded to 8 * nt cost MMA work and
    activation loads, never weight bytes, which each block reads once)."""
    mean = n_pairs / max(n_exp, 1)
    nt = 1 if mean <= 4 else 2 if mean <= 10 else 4 if mean <= 24 else 8
    return CudaTiles(nt=nt)


def sink_nt(t: int) -> int:
    """8-column tiles of a sink block: every token of the batch in one block (t <= 64)."""
    n = -(-t // 8)
    return 1 if n <= 1 else 2 if n <= 2 else 4 if n <= 4 else 8


def moe_w4a16_decode(x, w13, s13, g13, w2, s2, g2, ids, weights, sw13, sw2, gam, act, out,
                     tiles: CudaTiles) -> bool:  # fmt: skip
    """Fill act and out for the routed pairs and, when the batch fits one sink block (T <= 64), for
    the sinks too; returns whether the sinks were done (else the caller runs them)."""
    mod = _module()
    t, k = weights.shape
    n_pairs = t * k
    n_exp = w13.shape[0]
    pairs, block_expert = moe_align(ids, n_exp, 8 * tiles.nt)
    w32 = weights.reshape(-1).float()
    n_shared = sw13.shape[0] if sw13 is not None and t <= MAX_SINK_TOKENS else 0
    nt_s = sink_nt(t)
    n_sink_blocks = n_shared  # one block per sink: nt_s tiles of 8 cover the batch
    g32 = gam.float() if n_shared else w32.new_empty(0)
    sw13_, sw2_ = (sw13, sw2) if n_shared else (x.new_empty(0), x.new_empty(0))
    n_routed = block_expert.shape[0]
    common = (pairs, block_expert, w32, g32, act, out, n_pairs, t, k, n_sink_blocks)
    for up in (True, False):
        src, codes, scales, scale2, sink = (x, w13, s13, g13, sw13_) if up else (act, w2, s2, g2, sw2_)
        if n_shared and nt_s == tiles.nt:  # one launch: sink blocks first, the routed ones behind
            mod.moe_w4a16(up, tiles.nt, tiles.depth, 0, n_sink_blocks + n_routed, src, codes, scales, scale2, sink,
                          *common)  # fmt: skip
            continue
        if n_shared:
            mod.moe_w4a16(up, nt_s, tiles.depth, 0, n_sink_blocks, src, codes, scales, scale2, sink, *common)
        mod.moe_w4a16(up, tiles.nt, tiles.depth, n_sink_blocks, n_routed, src, codes, scales, scale2, sink, *common)
    return bool(n_shared)
