"""An MTP depth's dense weights at Inkling's width (input projection 6144 x 12288, the dense MLP's
gate/up 49152 x 6144 and down 6144 x 24576) as BF16 through cuBLAS (F.linear, what a depth runs
without --speculative-draft-model-quantization) and as fp8 codes through fp8_gemv (with it), at 1, 8
and 64 tokens, with 32- and 64-row bands.

Timed as bench_dense_gemv times: CUDA-graph replay of CALLS calls, each on its own weight copy (the L2
never holds the next call's weights), median over replays; `floor_fraction` is the weight bytes (codes
and row scales for fp8) at the card's bandwidth over the call's time.

    python benchmark/bench_fp8_gemv.py --out fp8_gemv.json
"""

from __future__ import annotations

import argparse
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
from sgl_inkling.layers.linear import quantize_fp8_rows  # noqa: E402
from sgl_inkling_kernels.fp8_gemv import fp8_gemv  # noqa: E402

SHAPES = {"input_proj": (6144, 12288), "mlp_w13": (49152, 6144), "mlp_w2": (6144, 24576)}


def time_shape(name: str, n: int, k: int, a: argparse.Namespace, tbs: float) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(n)
    ws = [torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) * k**-0.5 for _ in range(a.calls)]
    qs = [quantize_fp8_rows(w) for w in ws]
    rows = []
    for t in a.batch_sizes:
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        want = F.linear(x, ws[0]).float()
        forms = {"cublas_bf16": (lambda c, x=x: F.linear(x, ws[c]), n * k * 2)}
        for bn in (32, 64):
            forms[f"fp8_gemv_band{bn}"] = (lambda c, bn=bn, x=x: fp8_gemv(x, *qs[c], block_n=bn), n * k + n * 4)
        for form, (fn, nbytes) in forms.items():
            err = ((fn(0).float() - want).abs().max() / want.abs().max()).item()
            us = time_graph(fn, a.calls, a.replays) * 1e3
            floor_us = nbytes / (tbs * 1e12) * 1e6
            rows.append({"shape": name, "n": n, "k": k, "batch_size": t, "form": form, "us": us, "bytes": nbytes,
                         "floor_us": floor_us, "floor_fraction": floor_us / us, "max_rel_err_vs_bf16": err})  # fmt: skip
            print(f"{name:10s} t={t:2d} {form:18s} {us:8.2f} us  {floor_us / us:6.1%}  rel err {err:.1e}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--calls", type=int, default=6)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--out", default="")
    a = p.parse_args()
    tbs = peak_tb_s()
    rows = []
    for name, (n, k) in SHAPES.items():
        rows += time_shape(name, n, k, a, tbs)
        torch.cuda.empty_cache()
    commit, dirty = git_commit()
    result = {"benchmark": "bench_fp8_gemv", "gpu": torch.cuda.get_device_name(), "git_commit": commit,
              "git_dirty": dirty, "peak_tb_s": tbs, "calls_per_graph": a.calls, "results": rows}  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    print("\nshape       t  bf16 us  fp8 us (band)  fp8 floor %  speed-up")
    for name in SHAPES:
        for t in a.batch_sizes:
            sel = [r for r in rows if r["shape"] == name and r["batch_size"] == t]
            base = next(r for r in sel if r["form"] == "cublas_bf16")
            best = min((r for r in sel if r["form"] != "cublas_bf16"), key=lambda r: r["us"])
            print(f"{name:10s} {t:2d} {base['us']:8.1f} {best['us']:7.1f} ({best['form'][-2:]})"
                  f" {best['floor_fraction']:11.1%} {base['us'] / best['us']:8.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
