"""Which kernels a mixed step's decode riders add: the device kernels of one prefill forward alone and
with `--riders` decode tokens beside it (engine_timings.mixed_batch, eager as served), per kernel name,
sorted by what the riders add.

    python benchmark/profile_mixed_step.py --riders 32 --quantization modelopt_fp4 \
        --out benchmark/results/diagnostics/profile_mixed_step_inkling-slice-nvfp4.json

At 1fc17cb on the H200 (NVFP4 slice, 8K prompt, riders 8.7K deep) 32 riders added 12 ms to a 312 ms
prefill, 0.37 ms a token against 0.16 ms a token in a batch-64 decode step: mixing then costs more
than the decode steps it saves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_one_batch import Clock, git_commit  # noqa: E402
from benchmark.engine_timings import build_engine, mixed_batch  # noqa: E402
from benchmark.kernel_profile import kernel_rows  # noqa: E402


def kernels(e, n: int, riders: int, gen: torch.Generator) -> dict[str, dict]:
    clock = Clock(e.runner.device)
    with mixed_batch(e.runner, n, e.vocab, gen, riders, e.ctx, e.window) as fb:
        e.runner.forward(fb)  # warm-up (the same shapes)
        clock.sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            e.runner.forward(fb)
            clock.sync()
    return {r["name"]: r for r in kernel_rows(prof, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=("slice", "tiny"), default="slice")
    ap.add_argument("--input-len", type=int, default=8192)
    ap.add_argument("--output-len", type=int, default=1024, help="the riders are input + output / 2 deep")
    ap.add_argument("--riders", type=int, default=32)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_mixed_step: needs a CUDA device (it profiles device kernels)")
    e = build_engine(a.config, a.quantization, torch.device("cuda"), 0, a.riders + 1, a.input_len, a.output_len)
    gen = torch.Generator().manual_seed(0)
    alone, mixed = kernels(e, a.input_len, 0, gen), kernels(e, a.input_len, a.riders, gen)
    rows = []
    for name in alone.keys() | mixed.keys():
        us0 = alone.get(name, {}).get("us_per_step", 0.0)
        us1 = mixed.get(name, {}).get("us_per_step", 0.0)
        calls = mixed.get(name, {}).get("calls_per_step", 0.0)
        rows.append({"name": name, "us_alone": us0, "us_mixed": us1, "added_us": us1 - us0, "calls_mixed": calls})
    rows.sort(key=lambda r: -r["added_us"])
    total0 = sum(r["us_alone"] for r in rows) / 1e3
    total1 = sum(r["us_mixed"] for r in rows) / 1e3
    print(f"{e.name}: prefill of {a.input_len} alone {total0:.2f} ms of kernels, with {a.riders} riders "
          f"{e.ctx} deep {total1:.2f} ms (+{(total1 - total0) / max(a.riders, 1):.3f} ms a rider)")  # fmt: skip
    print(f"{'added us':>9} {'alone':>9} {'mixed':>9} {'calls':>6}  kernel")
    for r in rows[:20]:
        print(f"{r['added_us']:>9.1f} {r['us_alone']:>9.1f} {r['us_mixed']:>9.1f} {r['calls_mixed']:>6.0f}  {r['name'][:100]}")
    commit, dirty = git_commit()
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({
            "benchmark": "profile_mixed_step", "git_commit": commit, "git_dirty": dirty,
            "gpu": torch.cuda.get_device_name(), "config": e.name, "input_len": a.input_len,
            "rider_context_len": e.ctx, "riders": a.riders, "kernel_ms_alone": total0, "kernel_ms_mixed": total1,
            "kernels": rows,
        }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
