"""Where an MTP draft step's time goes, kernel by kernel (torch.profiler), on inkling-slice.

    python benchmark/profile_draft_step.py --batch-size 64 --accept 4.5 [--token-map-size 32768]

The step is run as serving runs it (DraftStep: trunk conv rollback, then 8 depths over the
committed tokens, the pending one and the drafts, padded to fixed shapes), after one verify
forward whose first `accept` tokens are kept. Kernel durations exclude launch gaps. With
--token-map-size N the depths draft over N token ids (as --speculative-token-map does; which ids
does not matter to the time), so two runs give what a draft vocabulary saves.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_one_batch import Seqs, draft_token_map  # noqa: E402
from benchmark.kernel_profile import kernel_rows, report, source_rows  # noqa: E402
from benchmark.mtp_timing import draft_step_args  # noqa: E402
from sgl_inkling.model_executor.model_loader import build_model, with_expert_quant  # noqa: E402
from sgl_inkling.model_executor.model_runner import ModelRunner  # noqa: E402
from sgl_inkling.models.inkling.quant_config import NVFP4_METHODS, resolve_quantization  # noqa: E402
from sgl_inkling.models.inkling.slice_config import slice_config  # noqa: E402
from sgl_inkling.models.inkling.weights import init_dummy_weights  # noqa: E402
from sgl_inkling.speculative.mtp_worker import MTPWorker  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--accept", type=int, default=4, help="verified tokens kept (accepted drafts + 1)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument(
        "--token-map-size", type=int, default=0, help="a draft vocabulary of this many ids (0: none)"
    )
    p.add_argument(
        "--depths",
        type=int,
        default=0,
        help="depths that draft (default all); with tails the others skip the step, as a step drafting k serves",
    )
    p.add_argument("--quantization", choices=NVFP4_METHODS, default=None,
                   help="NVFP4 routed experts (the draft depths are BF16 either way; the BF16 slice needs over 80 GB)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    config = with_expert_quant(slice_config(), resolve_quantization(args.quantization, None, "dummy"))
    model = build_model(config, torch.bfloat16, torch.device("cuda"))
    init_dummy_weights(model)
    cfg, bsz = config.text, args.batch_size
    ctx = args.input_len + 64
    runner = ModelRunner(model, bsz, ctx, bsz * ctx, attention_backend="triton")
    worker = MTPWorker(runner, None, token_map=draft_token_map(cfg, args.token_map_size))
    k = worker.num_steps
    gen = torch.Generator().manual_seed(0)

    def rand(n):
        return torch.randint(0, cfg.unpadded_vocab_size, (bsz, n), generator=gen).tolist()

    seqs = Seqs(runner, bsz)
    runner.forward(seqs.batch(rand(args.input_len)))
    starts = list(seqs.lens)
    vb = seqs.batch(rand(k + 1), logits_counts=[k + 1] * bsz)
    vb.sconv_capture = worker.trunk_capture
    out = runner.forward(vb)
    seqs.extra_slots(starts, k + 1, args.accept + k)
    step_args = draft_step_args(seqs.rows, starts, args.accept, vb, out, [t[0] for t in rand(1)])
    depths = args.depths or k
    # The depths past `depths` lag (lagging.py): their inputs go to the lag buffers from column 0.
    tail = {} if depths == k else {"depths": depths, "tail": depths, "lag_at": torch.zeros_like(step_args[1])}
    for _ in range(2):
        worker.step.run(*step_args, **tail)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        for _ in range(args.steps):
            worker.step.run(*step_args, **tail)
        torch.cuda.synchronize()
    report(f"draft step, batch {bsz}, {depths} of {k} depths, {args.accept} kept", kernel_rows(prof, args.steps),
           args.out, {"batch_size": bsz, "depths": depths, "num_steps": k, "kept": args.accept,
                      "token_map_size": args.token_map_size or None, "by_source": source_rows(prof, args.steps)},
           top=20)  # fmt: skip
    print(f"{'launches':>9} {'us/step':>9}  where (launching line)")
    for r in source_rows(prof, args.steps)[:30]:
        print(f"{r['launches_per_step']:>9.1f} {r['us_per_step']:>9.1f}  {r['where'][:100]}")


if __name__ == "__main__":
    main()
