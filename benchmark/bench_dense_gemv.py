"""A decode step's dense projections at Inkling's width (packed q/k/v/r of a sliding layer 13312 x 6144,
of a full layer 11264 x 6144, the output projection 6144 x 8192) through cuBLAS (F.linear) and through
dense_gemv with several tiles, at 1, 8 and 16 tokens.

Each call is what a decode step runs: an RMSNorm launch (a programmatic dependent on the GPUs that have
them, as in the model) whose output the projection reads. Timed as bench_moe_nvfp4 times: CUDA-graph
replay of CALLS such pairs, each on its own weight copy (the L2 never holds the next call's), median
over replays; `floor_fraction` is the weight bytes at the card's bandwidth over the pair's time (the
norm's few KB are left out, so the launch boundaries count against the projection).

    python benchmark/bench_dense_gemv.py --out dense_gemv.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_moe_nvfp4 import time_graph  # noqa: E402
from benchmark.bench_one_batch import git_commit  # noqa: E402
from benchmark.hbm_ceiling import peak_tb_s  # noqa: E402
from sgl_inkling_kernels.dense_gemv import TILES, GemvTiles, dense_gemv  # noqa: E402
from sgl_inkling_kernels.rmsnorm import rmsnorm  # noqa: E402

SHAPES = {"qkvr_sliding": (13312, 6144), "qkvr_full": (11264, 6144), "o_proj": (6144, 8192)}


def time_shape(shape_name: str, n: int, k: int, tiles: list[GemvTiles], a: argparse.Namespace, tbs: float) -> list[dict]:
    """Every form at every batch size on one weight shape (CALLS copies of the weight)."""
    g = torch.Generator(device="cuda").manual_seed(n)
    ws = [torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) * k**-0.5 for _ in range(a.calls)]
    gain = torch.ones(k, device="cuda", dtype=torch.bfloat16)
    floor_us = n * k * 2 / (tbs * 1e12) * 1e6
    rows = []
    for t in a.batch_sizes:
        h = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        want = F.linear(rmsnorm(h, gain, 1e-6), ws[0]).float()
        forms = [("cublas", lambda c, h=h: F.linear(rmsnorm(h, gain, 1e-6), ws[c]))]
        for tl_ in tiles:
            forms.append((json.dumps(dataclasses.asdict(tl_)),
                          lambda c, h=h, tl_=tl_: dense_gemv(rmsnorm(h, gain, 1e-6), ws[c], tl_)))  # fmt: skip
        for name, fn in forms:
            try:
                err = (fn(0).float() - want).abs().max().item()
                us = time_graph(fn, a.calls, a.replays) * 1e3
            except Exception as e:  # noqa: BLE001 - a tile that does not fit is a result, not the end
                print(f"{shape_name:13s} t={t:2d} {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            rows.append({"shape": shape_name, "n": n, "k": k, "batch_size": t, "form": name, "us": us,
                         "floor_us": floor_us, "floor_fraction": floor_us / us, "max_abs_err_vs_cublas": err})  # fmt: skip
            print(f"{shape_name:13s} t={t:2d} {name:100s} {us:7.2f} us  {floor_us / us:5.1%}  err {err:.2e}",
                  flush=True)  # fmt: skip
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--tiles", nargs="*", default=["32,256,256,4,4", "64,256,0,3,4", "64,256,512,3,4",
                                                  "64,128,256,5,4", "128,128,128,3,8"],
                   help="'block_n,block_k,pre_k,num_stages,num_warps' each; the shipped tiles always run")
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--out", default="")
    a = p.parse_args()
    tiles = [TILES] + [t for t in map(GemvTiles.parse, a.tiles) if t != TILES]
    tbs = peak_tb_s()
    rows = []
    for shape_name, (n, k) in SHAPES.items():
        rows += time_shape(shape_name, n, k, tiles, a, tbs)
        torch.cuda.empty_cache()
    commit, dirty = git_commit()
    result = {"benchmark": "bench_dense_gemv", "gpu": torch.cuda.get_device_name(), "git_commit": commit,
              "git_dirty": dirty, "peak_tb_s": tbs, "calls_per_graph": a.calls, "shipped_tiles": dataclasses.asdict(TILES),
              "results": rows}  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    best = {}
    for r in rows:
        key = (r["shape"], r["batch_size"])
        if r["form"] != "cublas" and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    print("\nshape          t   cublas us  shipped us  best us  best tiles")
    for (shape_name, t), b in best.items():
        cub = next(r["us"] for r in rows if r["shape"] == shape_name and r["batch_size"] == t and r["form"] == "cublas")
        ship = next((r["us"] for r in rows if r["shape"] == shape_name and r["batch_size"] == t
                     and r["form"] == json.dumps(dataclasses.asdict(TILES))), float("nan"))  # fmt: skip
        print(f"{shape_name:13s} {t:2d} {cub:10.2f} {ship:11.2f} {b['us']:8.2f}  {b['form']}")
    # The tiles with the least time over the three shapes at the smallest batch (a layer reads each once).
    t0 = min(a.batch_sizes)
    sums: dict[str, list[float]] = {}
    for r in rows:
        if r["batch_size"] == t0 and r["form"] != "cublas":
            sums.setdefault(r["form"], []).append(r["us"])
    full = {f: sum(v) for f, v in sums.items() if len(v) == len(SHAPES)}
    if full:
        pick = json.loads(min(full, key=full.get))
        print("PICK " + ",".join(str(int(v)) for v in pick.values()))


if __name__ == "__main__":
    main()
