"""Per-token cost of grammar masks: one sampling step over [B, V] logits with and without a grammar.

    python benchmark/bench_grammar.py                                  # CPU, batch 1 and 64
    python benchmark/bench_grammar.py --device cuda --batch-sizes 1 64 # on the GPU machine

Both variants run the scheduler's own sampler on the same random logits (V = 200058, Inkling's real
vocabulary, greedy by default). The grammar variant adds what the scheduler's hooks add per step:
filling the packed bitmask on the CPU (one xgrammar matcher per row), copying it to the device,
applying it to the logits, and advancing every matcher by its sampled token. Random logits make each
row a random walk through the grammar (keys, strings, numbers, structure), restarted when it ends.
The forward pass is not included: in the server the fill overlaps it on a GPU, so the figures here
are an upper bound on what a grammar adds to a decode step.
Writes benchmark/results/bench_grammar_<device>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sgl_inkling.chat.tokenizer import get_tokenizer  # noqa: E402
from sgl_inkling.constrained import chat_grammar, native_grammar  # noqa: E402
from sgl_inkling.constrained.backend import XGrammarBackend  # noqa: E402
from sgl_inkling.sampling.sampler import Sampler  # noqa: E402
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo  # noqa: E402
from sgl_inkling.sampling.sampling_params import SamplingParams  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 100000},
        "name": {"type": "string", "maxLength": 24},
        "status": {"enum": ["active", "inactive", "banned"]},
        "score": {"type": "number", "minimum": -10, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "zip": {"type": "string"}},
            "required": ["city"],
        },
    },
    "required": ["id", "name", "status", "address"],
}
TOOLS = [
    {"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA["properties"]["address"]}},
]


def grammar_spec(kind: str, tok):
    if kind == "json":  # native json_schema: the payload alone
        return native_grammar(tok, SamplingParams(json_schema=json.dumps(SCHEMA)), tok.encode("x"))
    return chat_grammar(tok, tools=TOOLS, tool_choice="required", thinking=False)  # TMLv0 tool turn


class Clock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def bench(batch: int, steps: int, warmup: int, kind: str | None, args, backend, tok, device) -> dict:
    vocab = tok.vocab_size
    gen = torch.Generator(device=device).manual_seed(batch)
    logits = torch.randn(batch, vocab, generator=gen, device=device) * 3
    params = [SamplingParams(temperature=args.temperature, max_new_tokens=1 << 20) for _ in range(batch)]
    info = SamplingBatchInfo.from_params(params, vocab, device)
    sampler = Sampler(seed=0)
    spec = grammar_spec(kind, tok) if kind else None
    grammars = [backend.new_request(spec) for _ in range(batch)] if spec else []
    if spec:
        backend.compile(spec).result()  # compile time is not a per-token cost
    clock = Clock(device)
    parts: dict[str, list[float]] = {"fill": [], "apply": [], "sample": [], "accept": [], "step": []}
    for step in range(warmup + steps):
        # Rows see different logits each step, as a model's would.
        x = logits.roll(shifts=step * 7919, dims=1).contiguous()
        t0 = clock.now()
        if grammars:
            bitmask, rows = backend.masker.fill(grammars, device)
            t1 = clock.now()
            dev_mask = bitmask.to(device, non_blocking=True) if device.type != "cpu" else bitmask
            backend.masker._apply_kernel(x, dev_mask, rows)
            t2 = clock.now()
        else:
            t1 = t2 = t0
        out = sampler.sample(x, info).to_host()
        t3 = clock.now()
        for i, g in enumerate(grammars):
            assert g.accept(out.next_token_ids[i]), "a sampled token broke the grammar"
            if g.terminated:
                grammars[i] = backend.new_request(spec)
        t4 = clock.now()
        if step >= warmup:
            for name, dt_ in (
                ("fill", t1 - t0),
                ("apply", t2 - t1),
                ("sample", t3 - t2),
                ("accept", t4 - t3),
            ):
                parts[name].append(dt_ * 1e3)
            parts["step"].append((t4 - t0) * 1e3)
    return {name: statistics.median(v) for name, v in parts.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--grammars", nargs="+", default=["json", "tools"], choices=["json", "tools"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--result-file", default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tok = get_tokenizer()
    backend = XGrammarBackend(tok, tok.vocab_size)
    backend.compiler()

    rows = []
    for batch in args.batch_sizes:
        base = bench(batch, args.steps, args.warmup, None, args, backend, tok, device)
        for kind in args.grammars:
            g = bench(batch, args.steps, args.warmup, kind, args, backend, tok, device)
            mask = g["fill"] + g["apply"] + g["accept"]
            row = {
                "batch": batch,
                "grammar": kind,
                "step_ms_without": round(base["step"], 3),
                "step_ms_with": round(g["step"], 3),
                "mask_ms_per_step": round(mask, 3),
                "mask_us_per_token": round(mask / batch * 1e3, 1),
                "ratio_with_over_without": round(g["step"] / base["step"], 3),
                "fill_ms": round(g["fill"], 3),
                "apply_ms": round(g["apply"], 3),
                "accept_ms": round(g["accept"], 3),
            }
            rows.append(row)
            print(
                f"batch {batch:3d} {kind:5s}: step {base['step']:8.2f} ms -> {g['step']:8.2f} ms "
                f"(x{row['ratio_with_over_without']:.2f}); mask {mask:7.2f} ms/step = "
                f"{row['mask_us_per_token']:7.1f} us/token (fill {g['fill']:.2f}, apply {g['apply']:.2f}, "
                f"accept {g['accept']:.2f})",
                flush=True,
            )
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {
        "benchmark": "bench_grammar",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": name,
        "torch_threads": torch.get_num_threads(),
        "vocab_size": tok.vocab_size,
        "temperature": args.temperature,
        "steps": args.steps,
        "rows": rows,
    }
    out = Path(args.result_file or ROOT / "benchmark" / "results" / f"bench_grammar_{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
