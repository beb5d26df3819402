"""Where a decode step's time goes, kernel by kernel (torch.profiler), on inkling-slice.

    python benchmark/profile_decode.py --batch-size 1

Kernel durations do not include launch gaps, so their sum per layer against the layer's floor
says how far the kernels themselves are from streaming at bandwidth; the difference to the CUDA
graph step is what launches and gaps cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_one_batch import Seqs  # noqa: E402
from benchmark.kernel_profile import kernel_rows, report  # noqa: E402
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
    report(f"batch {bsz}, {cfg.num_hidden_layers} layers + head", kernel_rows(prof, args.steps), args.out,
           {"batch_size": bsz})


if __name__ == "__main__":
    main()
