"""The peer: the transformers port (`transformers.models.inkling`) on the same configuration and GPU as
bench_one_batch, eager `generate` at batch 1 and at the largest batch that fits.

    python benchmark/bench_peer.py --config slice --batch-size 1 64        # on the H200
    python benchmark/bench_peer.py --config tiny --device cpu --input-len 8 --decode-steps 2 --extra-steps 2

Random weights (the port's own initialiser), built directly on the device in the target dtype (no
checkpoint, no CPU copy). Decode time per step = (time of generate(N + k) - time of generate(N)) / k,
so prefill and generate's set-up cancel out; each is the median of `--repeats` runs after a warm-up.
A batch size that runs out of memory is halved until one fits (reported in the JSON). Prompts are
seeded random ids of bench_one_batch's default length. Writes one JSON file under benchmark/results/,
which results_table.py pairs with bench_one_batch's to report our speed-up over the port.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from benchmark.bench_one_batch import git_commit  # noqa: E402
from sgl_inkling.models.inkling.slice_config import SLICE_CONFIG, SLICE_NAME  # noqa: E402
from sgl_inkling.models.inkling.tiny import TINY_CONFIG, TINY_NAME  # noqa: E402


def build_port(raw: dict, dtype: torch.dtype, device: torch.device):
    """The port's text model with random weights, allocated and initialised on `device` only.

    InklingForCausalLM, not the multimodal InklingForConditionalGeneration: text decode runs the same
    decoder and LM head either way, and the slice's config leaves the vision tower at its default
    size, whose projections alone would take about 1.5 TB (the towers never run for text).
    """
    from transformers.models.inkling import InklingConfig, InklingForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    text_config = InklingConfig.from_dict(copy.deepcopy(raw)).text_config
    with device:
        model = InklingForCausalLM._from_config(text_config, dtype=dtype, attn_implementation="eager")
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_generate(model, ids: torch.Tensor, new_tokens: int) -> float:
    """Seconds for one greedy generate of exactly `new_tokens` tokens (EOS cannot end it early)."""
    sync(ids.device)
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)  # fmt: skip
    sync(ids.device)
    dt_s = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + new_tokens, out.shape
    return dt_s


def measure(model, bsz: int, args, vocab: int, device: torch.device) -> dict:
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, vocab, (bsz, args.input_len), generator=gen).to(device)
    n, k = args.decode_steps, args.extra_steps
    timed_generate(model, ids, 2)  # warm-up: allocator, kernel selection
    short, long = [], []
    for _ in range(args.repeats):
        short.append(timed_generate(model, ids, n))
        long.append(timed_generate(model, ids, n + k))
    t_n, t_nk = statistics.median(short), statistics.median(long)
    step_ms = (t_nk - t_n) / k * 1e3
    return {
        "batch_size": bsz,
        "input_len": args.input_len,
        "generate_n_tokens": n,
        "generate_n_plus_k_tokens": n + k,
        "generate_n_s": t_n,
        "generate_n_plus_k_s": t_nk,
        "decode_step_ms": step_ms,
        "tok_per_s_per_user": 1e3 / step_ms if step_ms > 0 else None,
        "output_tok_per_s": bsz * 1e3 / step_ms if step_ms > 0 else None,
        # generate(N) = prefill + first token + (N - 1) decode steps.
        "prefill_ms_estimate": (t_n * 1e3 - (n - 1) * step_ms),
    }


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def run_batch_size(model, bsz: int, args, vocab: int, device: torch.device) -> tuple[dict | None, list[int]]:
    """Measure at `bsz`, halving it on out-of-memory; returns the run (or None) and the sizes that failed."""
    failed = []
    while bsz >= 1:
        try:
            return measure(model, bsz, args, vocab, device), failed
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not is_oom(e):
                raise
            failed.append(bsz)
            print(f"batch {bsz}: out of memory, halving", flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        bsz //= 2
    return None, failed


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=("slice", "tiny"), default="slice")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 64],
                   help="each is tried, halving on out-of-memory (the last is 'the largest that fits')")
    p.add_argument("--input-len", type=int, default=None, help="default: bench_one_batch's (1024 slice, 40 tiny)")
    p.add_argument("--decode-steps", type=int, default=8, help="N: tokens of the shorter generate")
    p.add_argument("--extra-steps", type=int, default=8, help="k: extra tokens of the longer generate")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    args.input_len = args.input_len or (1024 if args.config == "slice" else 40)
    raw, name = (SLICE_CONFIG, SLICE_NAME) if args.config == "slice" else (TINY_CONFIG, TINY_NAME)

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    model = build_port(raw, dtype, device)
    sync(device)
    gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    print(f"transformers port of {name}: {gb:.1f} GB of random weights on {device} in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    vocab = raw["text_config"]["unpadded_vocab_size"]
    import transformers

    commit, dirty = git_commit()
    result = {
        "benchmark": "bench_peer",
        "peer": "transformers InklingForCausalLM (the port's text model), eager attention, generate()",
        "config": name,
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "weights_gb": gb,
        "repeats": args.repeats,
        "requested_batch_sizes": args.batch_size,
        "out_of_memory_batch_sizes": {},
        "runs": [],
    }
    out = args.result_file or ROOT / "benchmark" / "results" / (
        f"bench_peer_{name}_{args.device.replace(':', '')}_{result['timestamp'].replace(':', '')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for bsz in args.batch_size:
            run, failed = run_batch_size(model, bsz, args, vocab, device)
            if failed:
                result["out_of_memory_batch_sizes"][bsz] = failed
            if run is not None:
                result["runs"].append(run)
                print(f"port bs {run['batch_size']:>3}: decode step {run['decode_step_ms']:.2f} ms, "
                      f"{run['tok_per_s_per_user']:.1f} tok/s/user, prefill ~{run['prefill_ms_estimate']:.0f} ms",
                      flush=True)  # fmt: skip
            out.write_text(json.dumps(result, indent=2))  # after every size: a time limit keeps the finished ones
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
