"""Where a decode step's time goes, kernel by kernel (torch.profiler), on inkling-slice.

    python benchmark/profile_decode.py --batch-size 1

Kernel durations do not include launch gaps, so their sum per layer against the layer's floor
says how far the kernels themselves are from streaming at bandwidth; the difference to the CUDA
graph step is what launches and gaps cost.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_one_batch import Seqs  # noqa: E402
from sgl_inkling.model_executor.model_loader import build_model  # noqa: E402
from sgl_inkling.model_executor.model_runner import ModelRunner  # noqa: E402
from sgl_inkling.models.inkling.slice_config import slice_config  # noqa: E402
from sgl_inkling.models.inkling.weights import init_dummy_weights  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    config = slice_config()
    model = build_model(config, torch.bfloat16, torch.device("cuda"))
    init_dummy_weights(model)
    cfg = config.text
    bsz = args.batch_size
    runner = ModelRunner(model, bsz, args.input_len + 64, bsz * (args.input_len + 64), attention_backend="triton")
    gen = torch.Generator().manual_seed(0)

    def rand(n):
        return torch.randint(0, cfg.unpadded_vocab_size, (bsz, n), generator=gen).tolist()

    seqs = Seqs(runner, bsz)
    runner.forward(seqs.batch(rand(args.input_len)))
    for _ in range(3):
        runner.forward(seqs.batch(rand(1)))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            runner.forward(seqs.batch(rand(1)))
        torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name][0] += 1
            per[e.name][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    n_layers = cfg.num_hidden_layers
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])
    total = sum(v[1] for v in per.values()) / args.steps / 1e3
    print(f"batch {bsz}: kernel time per step {total:.3f} ms over {n_layers} layers + head")
    print(f"{'us/step':>9} {'calls/step':>10}  kernel")
    for name, (count, us) in rows[:25]:
        print(f"{us / args.steps:>9.1f} {count / args.steps:>10.1f}  {name[:110]}")
    if args.out:
        args.out.write_text(json.dumps({
            "batch_size": bsz, "kernel_ms_per_step": total,
            "kernels": [{"name": n, "calls_per_step": c / args.steps, "us_per_step": u / args.steps} for n, (c, u) in rows],
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
