"""Where a decode step's time goes, kernel by kernel (torch.profiler), on inkling-slice.

    python benchmark/profile_decode.py --batch-size 1 [--unfused | --compare] [--quantization modelopt_fp4]
    python benchmark/profile_decode.py --batch-size 1 --tokens 5 --quantization modelopt_fp4  # an MTP verify of 4 drafts

`--unfused` profiles the kernels as they were before the decode fusions (sgl_inkling_kernels.
_triton.unfused_decode); `--compare` profiles both in one run and writes {"unfused": ..., "fused": ...}.
Per-op floor fractions (time against bytes / 4.3 TB/s) for the fused ops and what they replace
are in benchmark/bench_decode_ops.py.

Kernel durations do not include launch gaps, so their sum per layer against the layer's floor
says how far the kernels themselves are from streaming at bandwidth; the difference to the CUDA
graph step is what launches and gaps cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_one_batch import Seqs  # noqa: E402
from benchmark.kernel_profile import kernel_rows, report  # noqa: E402
from sgl_inkling.model_executor.model_loader import build_model, with_expert_quant  # noqa: E402
from sgl_inkling.model_executor.model_runner import ModelRunner  # noqa: E402
from sgl_inkling.models.inkling.quant_config import NVFP4_METHODS, resolve_quantization  # noqa: E402
from sgl_inkling.models.inkling.slice_config import slice_config  # noqa: E402
from sgl_inkling.models.inkling.weights import init_dummy_weights  # noqa: E402
from sgl_inkling_kernels._triton import unfused_decode  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--tokens", type=int, default=1,
                   help="tokens per request and step: > 1 profiles an MTP verify's shape (an extend of that many "
                   "tokens with logits at each, as verify_graphs runs it, without its conv-window capture)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--unfused", action="store_true", help="the kernels before the decode fusions")
    p.add_argument("--compare", action="store_true", help="profile unfused, then fused")
    p.add_argument("--quantization", choices=NVFP4_METHODS, default=None, help="routed experts in NVFP4")
    args = p.parse_args()
    config = with_expert_quant(slice_config(), resolve_quantization(args.quantization, None, "dummy"))
    model = build_model(config, torch.bfloat16, torch.device("cuda"))
    init_dummy_weights(model)
    cfg = config.text
    bsz = args.batch_size
    ctx = args.input_len + (args.steps + 3) * args.tokens + 64  # the prompt, warm-up and profiled steps
    runner = ModelRunner(model, bsz, ctx, bsz * ctx, attention_backend="triton")
    gen = torch.Generator().manual_seed(0)

    def rand(n):
        return torch.randint(0, cfg.unpadded_vocab_size, (bsz, n), generator=gen).tolist()

    seqs = Seqs(runner, bsz)

    def step():
        return seqs.batch(rand(args.tokens), logits_counts=[args.tokens] * bsz if args.tokens > 1 else None)

    runner.forward(seqs.batch(rand(args.input_len)))
    variants = ["unfused", "fused"] if args.compare else ["unfused" if args.unfused else "fused"]
    results = {}
    for name in variants:
        with unfused_decode() if name == "unfused" else contextlib.nullcontext():
            for _ in range(3):
                runner.forward(step())
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.steps):
                    runner.forward(step())
                torch.cuda.synchronize()
        meta = {"batch_size": bsz, "tokens_per_request": args.tokens, "input_len": args.input_len, "kernels_variant": name}
        rows = kernel_rows(prof, args.steps)
        shape = f"batch {bsz}" + (f" x {args.tokens} tokens" if args.tokens > 1 else "")
        title = f"{shape}, {cfg.num_hidden_layers} layers + head, {name}"
        total = report(title, rows, None if args.compare else args.out, meta)
        results[name] = {**meta, "kernel_ms_per_step": total, "kernels": rows}
    if args.compare and args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
