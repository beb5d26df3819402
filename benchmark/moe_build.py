"""Benchmark-only choice of the CUDA NVFP4 MoE kernels' build (moe_w4a16_cuda.BUILD).

A spec is "field=value,..." over CudaTiles' fields other than nt and row_tiles (which the batch decides), e.g.
"cp_async=8,split_sinks=1"; "" is the shipped default. `--pick FILE` prints the spec (every field)
of the CUDA variant of a bench_moe_nvfp4 JSON that is fastest summed over its batch sizes, or ""
when the run's default dispatch was, so that one GPU call can measure the sweep and then time
decode with the winner:

    python benchmark/moe_build.py --pick results/bench_moe_nvfp4_inkling-slice.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "kernels")]

from sgl_inkling_kernels import moe_w4a16_cuda  # noqa: E402
from sgl_inkling_kernels.moe_w4a16_cuda import CudaTiles  # noqa: E402

FIELDS = [f.name for f in dataclasses.fields(CudaTiles) if f.name not in ("nt", "row_tiles")]  # the batch's
# Build options measured and removed since (older JSON records them): a variant with one of them on
# was a build that no longer exists, so it is never picked (its spec would name a different build).
REMOVED = ("fused", "persist", "bulk")


def parse(spec: str) -> CudaTiles:
    kw = {}
    for item in filter(None, (spec or "").split(",")):
        name, _, value = item.partition("=")
        if name not in FIELDS:
            raise SystemExit(f"moe build: unknown field {name!r} (one of {', '.join(FIELDS)})")
        kw[name] = int(value)
    return dataclasses.replace(CudaTiles(), **kw)


def apply(spec: str) -> CudaTiles:
    """Make `spec` the default build for this process's MoE calls."""
    moe_w4a16_cuda.BUILD = parse(spec)
    return moe_w4a16_cuda.BUILD


DEFAULT = "default dispatch"


def spec_of(tiles: dict) -> str:
    """The spec of a variant's tiles: every build field it records."""
    return ",".join(f"{k}={tiles[k]}" for k in FIELDS if k in tiles)


def pick(doc: dict) -> str:
    totals: dict[str, list[float]] = {}
    for r in doc["results"]:
        row: dict[str, float] = {}
        for v in r["variants"]:
            path = v["tiles"].get("path")
            if "ms" not in v or path not in ("cuda", "default dispatch"):
                continue
            if path == "cuda" and (v["tiles"].get("nt", 1) != 1 or v["tiles"].get("row_tiles", 1) != 1):
                continue  # nt and row_tiles are the batch's choice, not a build's
            if any(v["tiles"].get(k) for k in REMOVED):
                continue
            key = DEFAULT if path == DEFAULT else spec_of(v["tiles"])
            row[key] = min(row.get(key, float("inf")), v["ms"])
        base = row.get(DEFAULT)
        for key, ms in row.items():  # relative to the default, so every batch size weighs the same
            totals.setdefault(key, []).append(ms / base if base else ms)
    n = max((len(t) for t in totals.values()), default=0)
    full = {k: sum(t) for k, t in totals.items() if len(t) == n}
    return min(full, key=full.get) if full else DEFAULT


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pick", type=Path, required=True)
    best = pick(json.loads(p.parse_args().pick.read_text()))
    print("" if best == DEFAULT else best)


if __name__ == "__main__":
    main()
