"""One fused NVFP4 MoE call at Inkling's width (8 experts unless --experts, top-6, 2 sinks), for Nsight Compute.

    ncu --clock-control none -k regex:_up_kernel --launch-skip 2 --launch-count 1 \
        python benchmark/profile_moe_nvfp4.py [--batch-size 1] [--tiles 32,64,128,128,4,3] [--moe-build row_ring=0]

Runs the call three times (the first two compile and warm up); random codes and scales, never zero.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_moe_nvfp4 import quantized  # noqa: E402
from benchmark.moe_build import apply as apply_moe_build  # noqa: E402
from sgl_inkling_kernels.fused_moe_nvfp4 import Tiles, fused_moe_nvfp4  # noqa: E402
from sgl_inkling_kernels.nvfp4_layout import to_mma_layout  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--experts", type=int, default=8, help="routed experts (256: Inkling's, where a batch of 64 hits "
                   "about 200 with one or two tokens each: the kernels' steady state)")
    p.add_argument("--tiles", default=None, help="up_n,down_n,kb,bk_sink,warps,stages")
    p.add_argument("--moe-build", default="", help="the CUDA decode build, 'field=value,...' (benchmark/moe_build.py), "
                   "e.g. row_ring=0 (the chunk ring); default: the shipped one")
    args = p.parse_args()
    apply_moe_build(args.moe_build)
    h, i, e, k, s, t = 6144, 3072, args.experts, 6, 2, args.batch_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13, w2 = ((to_mma_layout(c), sc, s2) for c, sc, s2 in (quantized(e, 2 * i, h, gen), quantized(e, h, i, gen)))
    sw13 = (torch.randn(s, 2 * i, h, generator=gen, device="cuda") * h**-0.5).bfloat16()
    sw2 = (torch.randn(s, h, i, generator=gen, device="cuda") * i**-0.5).bfloat16()
    x = torch.randn(t, h, generator=gen, device="cuda").bfloat16()
    ids = torch.rand(t, e, generator=gen, device="cuda").topk(k, dim=1).indices
    wts = torch.rand(t, k, generator=gen, device="cuda").bfloat16()
    gam = torch.rand(t, s, generator=gen, device="cuda").bfloat16()
    tiles = Tiles(*map(int, args.tiles.split(","))) if args.tiles else None
    for _ in range(3):
        fused_moe_nvfp4(x, *w13, *w2, ids, wts, sw13, sw2, gam, tiles=tiles, layout="mma")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
