"""Prefix-cache benchmark: tokens served from the radix cache against the ideal, TTFT cold vs cached,
and the memory a cached token costs.

Configs: `tiny` (inkling-tiny, CPU), `w512` (inkling-tiny-w512: Inkling's real 512-token window at
small width, CPU), `slice` (inkling-slice with dummy weights, `--device cuda`). Cases (random token
ids, fixed seeds; see prefix_cache_cases.py for the ideal):
  exact_resume    repeat x3, strict prefix x2, prompt ending on a divergence node, prompt logprobs
  shared_prefix   a 3,000-token system prompt, then 8 different long user turns
  follow_ups      concurrent first turns, then all their follow-ups (CPU: a tiny --max-total-tokens
                  and --max-running-requests 2; slice: 256 turns of 3-6K tokens at full capacity)
  multi_turn, agent_loop   conversations and tool loops that extend their own context
  ttft            cold vs cached (+10 new tokens), after a warm-up of the same path at another length
memory_per_cached_token: full KV, sliding KV and checkpoint bytes per cached token, from the pool
sizes at the default interval (every cached token resumable every interval tokens) and as measured
under pressure after follow_ups.

    python benchmark/bench_prefix_cache.py --config w512 [--quick]
    python benchmark/bench_prefix_cache.py --config slice --device cuda
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "python")]

import sglang  # noqa: E402
from benchmark import prefix_cache_cases as cases  # noqa: E402
from benchmark.bench_one_batch import git_commit  # noqa: E402


def engine_args(config: str, device: str) -> dict:
    if config == "slice":
        from benchmark.slice_dir import write_slice_dir

        return {"model_path": str(write_slice_dir()), "load_format": "dummy", "device": device}
    if config == "w512":
        from sgl_inkling.models.inkling.tiny_window import ensure_tiny_window_checkpoint

        return {"model_path": str(ensure_tiny_window_checkpoint()), "device": device}
    return {"device": device}


def memory_per_cached_token(st: dict) -> dict:
    """Bytes per cached token: at the default (what the pools are sized for) and as held now."""
    full_b, swa_b = st["full_kv_bytes_per_token"], st["swa_kv_bytes_per_token"]
    ckpt_b, interval, window = st["sconv_checkpoint_bytes"], st["sconv_checkpoint_interval"], st["sliding_window_size"]
    swa_share = min(1.0, (window - 1) / interval)  # sliding KV kept: the window before each checkpoint
    default = {"full_kv": full_b, "sliding_kv": swa_b * swa_share, "checkpoints": ckpt_b / interval}
    default["total"] = sum(default.values())
    n = max(1, st["radix_cached_tokens"])
    held = {
        "cached_tokens": st["radix_cached_tokens"],
        "full_kv": full_b,
        "sliding_kv": swa_b * st["radix_swa_tokens"] / n,
        "checkpoints": st["radix_checkpoint_bytes"] / n,
    }
    held["total"] = held["full_kv"] + held["sliding_kv"] + held["checkpoints"]
    pools = st["full_kv_total"] * full_b + st["swa_kv_total"] * swa_b + st["sconv_checkpoints_total"] * ckpt_b
    return {"at_default": default, "held": held, "pool_bytes_per_full_kv_slot": pools / st["full_kv_total"],
            "pool_slots": {k: st[k] for k in ("full_kv_total", "swa_kv_total", "sconv_checkpoints_total")},
            "checkpoint_bytes": ckpt_b, "interval": interval,
            "window": window, "full_kv_bytes_per_token": full_b, "swa_kv_bytes_per_token": swa_b}  # fmt: skip


def counters(st: dict) -> dict:
    return {k: v for k, v in st.items() if k.startswith(("radix_", "sconv_"))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=("tiny", "w512", "slice"), default="tiny")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gpu, q = args.device == "cuda", args.quick
    base = engine_args(args.config, args.device)
    rng = random.Random(0)
    results: dict = {}
    engine = sglang.Engine(**base, **({} if gpu else {"max_total_tokens": 60_000}))
    results["exact_resume"] = cases.exact_resume(engine, rng, 1300 if q else 2500)
    results["shared_prefix"] = cases.shared_prefix(engine, rng, 3000, 2 if q else 8, 300, 800 if q else 2000)
    results["multi_turn"] = cases.multi_turn(engine, rng, convs=3 if q else 8, turns=3 if q else 5)
    results["agent_loop"] = cases.agent_loop(engine, rng, agents=2 if q else 5, steps=3 if q else 6)
    if gpu:  # the server's own capacity, SGLang's default concurrency
        results["follow_ups"] = cases.follow_ups(engine, rng, 16 if q else 256, 3000, 6000)
    results["memory_per_cached_token"] = memory_per_cached_token(cases.state(engine))
    results["ttft"] = cases.ttft(engine, rng, 8192 if gpu else (1500 if q else 4000), repeats=3 if q else 8)
    results["counters"] = counters(cases.state(engine))
    engine.shutdown()
    if not gpu:  # memory pressure: a cache far smaller than the working set, two requests at a time
        pressed = sglang.Engine(**base, max_total_tokens=8000, max_running_requests=2)
        results["follow_ups"] = cases.follow_ups(pressed, rng, 10 if q else 16, 800, 1100)
        results["memory_under_pressure"] = memory_per_cached_token(cases.state(pressed))
        results["counters_under_pressure"] = counters(cases.state(pressed))
        pressed.shutdown()
    commit, dirty = git_commit()
    report = {"benchmark": "prefix_cache", "config": args.config, "device": args.device, "commit": commit,
              "dirty": dirty, "quick": q, **results}  # fmt: skip
    if gpu:
        import torch

        report["gpu"] = torch.cuda.get_device_name(0)
    text = json.dumps(report, indent=2)
    print(text)
    out = Path(args.out or ROOT / "benchmark" / "results" / f"prefix_cache_{args.device}_{args.config}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
