"""The engine's own step times for a serving workload, measured bench_one_batch-style in their own
process (a separate stage before the server starts: the GPU holds one copy of the slice at a time).

    python benchmark/engine_timings.py --config slice --input-len 8192 --output-len 1024 \
        --batch-size 1 16 64 256 --out benchmark/results/engine_timings_inkling-slice.json \
        [--quantization modelopt_fp4]  # NVFP4 routed experts, as the server's --quantization

Measures (CUDA events on the GPU, median of repeats after a warm-up):
- the prefill of one `--input-len`-token prompt (one EXTEND forward, eager as served), and with
  `--mixed-riders` the same forward carrying that many decode tokens (a mixed step);
- the decode step at each batch size with every sequence `input-len + output-len / 2` tokens deep
  (the mean context of a 1K-token decode), replayed from a CUDA graph as the server does. The KV
  read is real (the slots are allocated; their contents are whatever the pool holds, which costs
  the same), the token ids random. `--decode-layout serving` interleaves the last output-len / 2
  positions' slots across the batch, as the server's decode steps leave them (one slot per running
  request per step), where the default gives each sequence one run.
bench_serving --engine-timings reads the JSON and puts the back-to-back figure beside each level.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_one_batch import Clock, git_commit, replay_ms  # noqa: E402
from sgl_inkling.model_executor.cuda_graph_runner import capture_forward  # noqa: E402
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from sgl_inkling.model_executor.model_loader import build_model, with_expert_quant  # noqa: E402
from sgl_inkling.model_executor.model_runner import ModelRunner  # noqa: E402
from sgl_inkling.models.inkling.config import InklingConfig  # noqa: E402
from sgl_inkling.models.inkling.quant_config import NVFP4_METHODS, resolve_quantization  # noqa: E402
from sgl_inkling.models.inkling.slice_config import slice_config  # noqa: E402
from sgl_inkling.models.inkling.tiny import TINY_CONFIG  # noqa: E402
from sgl_inkling.models.inkling.weights import init_dummy_weights  # noqa: E402


@dataclass
class Deep:
    """Sequences `ctx` tokens deep, each with its next token's slots (the last of each run)."""

    rows: list[int]
    out_full: list[int]
    out_swa: list[int]


@contextmanager
def deep_sequences(runner: ModelRunner, bsz: int, ctx: int, window: int, interleaved: int = 0) -> Iterator[Deep]:
    """`bsz` sequences about to decode their token at position `ctx`: full KV for every position,
    sliding KV for the window only (older sliding slots are freed in serving too). `interleaved`: the
    last that many positions of every sequence (and of its window) in slots interleaved across the
    batch, as serving's decode steps lay them out; 0: every sequence's slots in one run. Freed on exit."""
    r, tail = runner, interleaved + 1 if interleaved else 0
    rows = [r.req_to_token.alloc() for _ in range(bsz)]
    fulls = _slots(r.full_pool.allocator.alloc, bsz, ctx + 1, tail)
    swas = _slots(r.swa_pool.allocator.alloc, bsz, window + 1, tail)
    for row, full, swa in zip(rows, fulls, swas):
        r.req_to_token.write("full", row, 0, full)
        r.req_to_token.write("swa", row, ctx - window, swa)
    try:
        yield Deep(rows, [int(f[-1]) for f in fulls], [int(w[-1]) for w in swas])
    finally:
        for row, full, swa in zip(rows, fulls, swas):
            r.full_pool.allocator.free(full)
            r.swa_pool.allocator.free(swa)
            r.req_to_token.free(row)


@contextmanager
def mixed_batch(runner: ModelRunner, n: int, vocab: int, gen: torch.Generator, riders: int = 0, ctx: int = 0,
                window: int = 0) -> Iterator[ForwardBatch]:  # fmt: skip
    """An EXTEND batch of one `n`-token prompt; with `riders`, a mixed step: the same chunk followed by
    one decode token for each of that many deep_sequences, as --enable-mixed-chunk batches them. Its
    rows and slots are freed on exit."""
    r = runner
    row = r.req_to_token.alloc()
    full, swa = r.full_pool.allocator.alloc(n), r.swa_pool.allocator.alloc(n)
    r.req_to_token.write("full", row, 0, full)
    r.req_to_token.write("swa", row, 0, swa)
    ids = [torch.randint(0, vocab, (n,), generator=gen).tolist()]
    ids += torch.randint(0, vocab, (riders, 1), generator=gen).tolist()
    try:
        with deep_sequences(r, riders, ctx, window) as d:
            yield ForwardBatch.build(ForwardMode.EXTEND, ids, [row, *d.rows], [0] + [ctx] * riders,
                                     full.tolist() + d.out_full, swa.tolist() + d.out_swa, r.device)  # fmt: skip
    finally:
        r.full_pool.allocator.free(full)
        r.swa_pool.allocator.free(swa)
        r.req_to_token.free(row)


def prefill_ms(runner: ModelRunner, n: int, vocab: int, repeats: int, gen: torch.Generator,
               riders: int = 0, ctx: int = 0, window: int = 0) -> float:  # fmt: skip
    """One EXTEND forward of `mixed_batch`, eager as served: the median of `repeats` after a warm-up."""
    clock, times = Clock(runner.device), []
    for rep in range(repeats + 1):  # the first is warm-up
        with mixed_batch(runner, n, vocab, gen, riders, ctx, window) as fb:
            a = clock.mark()
            runner.forward(fb)
            b = clock.mark()
            clock.sync()
        if rep:
            times.append(clock.ms(a, b))
    return statistics.median(times)


def _slots(alloc, bsz: int, n: int, tail: int) -> list[torch.Tensor]:
    """n slots for each of bsz sequences: the first n - tail of each as one run, the last `tail` interleaved
    across the sequences (token j of sequence i at j * bsz + i of one block), as decode steps that
    allocate one slot per running request leave them."""
    tail = min(tail, n)
    heads = [alloc(n - tail) for _ in range(bsz)]
    if not tail:
        return heads
    block = alloc(bsz * tail).view(tail, bsz)
    return [torch.cat([h, block[:, i]]) for i, h in enumerate(heads)]


def decode_ms(runner: ModelRunner, bsz: int, ctx: int, window: int, vocab: int, steps: int, gen,
              sustained: int = 0, interleaved: int = 0) -> tuple[float, float | None]:  # fmt: skip
    """One decode step of `bsz` deep_sequences (`interleaved` as there): the median of single timed
    replays, and on CUDA the mean of `sustained` replays back to back (as serving runs them, for
    seconds: clocks and power under a long run, no pause for the host between steps)."""
    r = runner
    ids = torch.randint(0, vocab, (bsz, 1), generator=gen).tolist()
    clock = Clock(r.device)
    with deep_sequences(r, bsz, ctx, window, interleaved) as d:
        fb = ForwardBatch.build(ForwardMode.DECODE, ids, d.rows, [ctx] * bsz, d.out_full, d.out_swa, r.device)
        if clock.cuda:
            graph, _ = capture_forward(r, fb)
            single = statistics.median(replay_ms(graph.replay, steps))
            if not sustained:
                return single, None
            a = clock.mark()
            for _ in range(sustained):
                graph.replay()
            b = clock.mark()
            clock.sync()
            return single, clock.ms(a, b) / sustained
        r.forward(fb)  # warm-up
        times = []
        for _ in range(steps):
            a = clock.mark()
            r.forward(fb)
            times.append(clock.ms(a, clock.mark()))
        return statistics.median(times), None


@dataclass
class Engine:
    runner: ModelRunner
    name: str  # inkling-slice[-nvfp4] / inkling-tiny[-nvfp4]
    window: int
    vocab: int
    ctx: int  # the decode depth: input_len + output_len / 2
    cuda: bool


def build_engine(config_name: str, quantization: str | None, device: torch.device, seed: int, most: int,
                 input_len: int, output_len: int) -> Engine:  # fmt: skip
    """The model (dummy weights) and a runner with pools for `most` sequences `input_len + output_len` deep."""
    cuda = device.type == "cuda"
    config = slice_config() if config_name == "slice" else InklingConfig.from_dict(TINY_CONFIG)
    expert_quant = resolve_quantization(quantization, None, "dummy")
    config = with_expert_quant(config, expert_quant)
    name = ("inkling-slice" if config_name == "slice" else "inkling-tiny") + (
        "-nvfp4" if expert_quant else ""
    )
    t0 = time.perf_counter()
    model = build_model(config, torch.bfloat16 if cuda else torch.float32, device)
    init_dummy_weights(model, seed=seed)
    Clock(device).sync()
    print(f"{name}: dummy weights in {time.perf_counter() - t0:.1f} s", flush=True)
    window, vocab = config.text.sliding_window_size, config.text.unpadded_vocab_size
    ctx = input_len + output_len // 2
    runner = ModelRunner(model, most, ctx + output_len + 8, most * (ctx + 1) + input_len + 8,
                         most * (window + 1) + input_len + 8, "triton" if cuda else "torch_native")  # fmt: skip
    return Engine(runner, name, window, vocab, ctx, cuda)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=("slice", "tiny"), default="slice")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--input-len", type=int, default=8192)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--decode-steps", type=int, default=10)
    p.add_argument("--prefill-repeats", type=int, default=2)
    p.add_argument(
        "--sustained-steps",
        type=int,
        default=0,
        help="also time this many decode replays back to back per batch size (CUDA)",
    )
    p.add_argument(
        "--decode-layout",
        choices=("runs", "serving"),
        default="runs",
        help="runs: every sequence's KV slots in one run; serving: the last output-len / 2 positions "
        "interleaved across the batch, as decode steps allocate them in the server",
    )
    p.add_argument(
        "--mixed-riders",
        type=int,
        nargs="*",
        default=[],
        help="also time the prefill with this many decode riders at the decode depth (mixed steps)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quantization", choices=NVFP4_METHODS, default=None, help="NVFP4 routed experts (dummy codes)"
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    most = max(args.batch_size + [n + 1 for n in args.mixed_riders])  # a mixed step: its prompt and riders
    e = build_engine(args.config, args.quantization, torch.device(args.device), args.seed, most, args.input_len,
                     args.output_len)  # fmt: skip
    runner, name, window, vocab, ctx, cuda = e.runner, e.name, e.window, e.vocab, e.ctx, e.cuda
    gen = torch.Generator().manual_seed(args.seed)
    pre = prefill_ms(runner, args.input_len, vocab, args.prefill_repeats, gen)
    print(f"prefill of {args.input_len} tokens: {pre:.1f} ms", flush=True)
    mixed = {}
    for n in args.mixed_riders:
        mixed[str(n)] = prefill_ms(runner, args.input_len, vocab, args.prefill_repeats, gen, n, ctx, window)
        print(f"prefill of {args.input_len} tokens with {n} decode riders {ctx} tokens deep: {mixed[str(n)]:.1f} ms",
              flush=True)  # fmt: skip
    interleaved = args.output_len // 2 if args.decode_layout == "serving" else 0
    steps, sustained = {}, {}
    for bsz in sorted(args.batch_size):
        steps[str(bsz)], sustained[str(bsz)] = decode_ms(runner, bsz, ctx, window, vocab, args.decode_steps, gen,
                                                         args.sustained_steps, interleaved)  # fmt: skip
        more = f" ({sustained[str(bsz)]:.2f} ms sustained)" if sustained[str(bsz)] else ""
        print(f"decode step at batch {bsz}, {ctx} tokens deep: {steps[str(bsz)]:.2f} ms{more}", flush=True)
    commit, dirty = git_commit()
    result = {
        "benchmark": "engine_timings",
        "config": name,
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "gpu": torch.cuda.get_device_name(runner.device) if cuda else None,
        "torch": torch.__version__,
        "cuda_graph": cuda,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "decode_context_len": ctx,
        "decode_layout": args.decode_layout,
        "prefill_ms": pre,
        "mixed_step_ms": mixed,  # riders -> the prefill with that many decode tokens beside it
        "decode_step_ms": steps,
        "decode_step_sustained_ms": sustained,  # null where not measured
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
