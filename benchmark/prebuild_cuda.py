"""Build, in parallel, every CUDA NVFP4 MoE library a GPU run will load (one per combination of
build choices): the shipped default (with its chunk-ring fallback, and its one-launch form where it
has one), the build of each case of the CUDA kernel tests, and the `c:` specs of a bench_moe_nvfp4
sweep. Run before the stages that test and time them, so that a run's many nvcc builds (seconds each, one after another inside the tests)
share the machine's cores instead of its time limit:

    python benchmark/prebuild_cuda.py "c:1,4,8,256,4,1,0,8,1,1,1,0,0,0,1" ...
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "python")]

from benchmark.bench_moe_nvfp4 import parse_tiles  # noqa: E402
from sgl_inkling_kernels import moe_w4a16_cuda  # noqa: E402

TESTS = ROOT / "test" / "kernels" / "test_fused_moe_nvfp4.py"


def test_tiles() -> list:
    spec = importlib.util.spec_from_file_location("cuda_cases", TESTS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [t for _, t in mod.CUDA_CASES if t is not None]


def main(specs: list[str]) -> None:
    build = moe_w4a16_cuda.BUILD
    # the default, and the chunk ring it takes for scales off 8-byte boundaries (moe_w4a16_cuda.ring_for)
    tiles = [build, dataclasses.replace(build, row_ring=0), *test_tiles()]
    if not build.sink_stream:  # the one-launch form default_cuda_tiles gives the smallest batches
        tiles.append(dataclasses.replace(build, split_sinks=0))
    tiles += [t for t in (parse_tiles(s)[0] for s in specs) if isinstance(t, moe_w4a16_cuda.CudaTiles)]
    defines = sorted({t.defines() for t in tiles})
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(moe_w4a16_cuda._library, defines))
    print(f"{len(defines)} CUDA MoE libraries ready in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
