"""Prefix-cache benchmark: tokens served from the radix cache against the ideal, and TTFT cold vs cached.

Workloads (random token ids, fixed seeds):
  multi_turn     conversations whose next prompt = previous prompt + answer + a new user turn
  shared_system  one ~2,000-token system prompt, 100 users with turns of 10 to 2,000 tokens
  agent_loop     agents appending their call and a tool result to the context at every step

ideal = for each request, the longest prefix of its prompt that some earlier request already
computed (prompt + answer), capped so at least one token is left to compute. The ratio
sum(cached) / sum(ideal) is what fraction of the reusable work the cache actually saved.

    python benchmark/bench_prefix_cache.py [--quick] [--out benchmark/results/x.json]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import time
from pathlib import Path

import sglang
from sgl_inkling.mem_cache.radix_cache import common_prefix_len


class Runner:
    def __init__(self, engine: sglang.Engine):
        self.engine = engine
        self.history: list[list[int]] = []
        self.cached = self.ideal = self.prompt_tokens = 0

    def ask(self, prompt: list[int], max_new: int = 8) -> list[int]:
        ideal = max((common_prefix_len(prompt, h) for h in self.history), default=0)
        out = self.engine.generate(
            input_ids=prompt, sampling_params={"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
        )
        self.cached += out["meta_info"]["cached_tokens"]
        self.ideal += min(ideal, len(prompt) - 1)
        self.prompt_tokens += len(prompt)
        self.history.append(prompt + out["output_ids"])
        return out["output_ids"]

    def result(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "ideal_cached_tokens": self.ideal,
            "cached_tokens": self.cached,
            "fraction_of_ideal": self.cached / self.ideal if self.ideal else 1.0,
        }


def toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(0, 199_990) for _ in range(n)]


def multi_turn(engine, rng, convs: int, turns: int) -> dict:
    r = Runner(engine)
    prompts = [toks(rng, rng.randint(20, 200)) for _ in range(convs)]
    for _ in range(turns):
        for i in range(convs):  # interleaved, as concurrent users would be
            out = r.ask(prompts[i], max_new=rng.randint(8, 24))
            prompts[i] = prompts[i] + out + toks(rng, rng.randint(10, 80))
    return r.result()


def shared_system(engine, rng, users: int, system_len: int, max_turn: int) -> dict:
    r = Runner(engine)
    system = toks(rng, system_len)
    for _ in range(users):
        r.ask(system + toks(rng, rng.randint(10, max_turn)), max_new=1)
    return r.result()


def agent_loop(engine, rng, agents: int, steps: int) -> dict:
    r = Runner(engine)
    contexts = [toks(rng, 300) + toks(rng, rng.randint(30, 90)) for _ in range(agents)]
    for _ in range(steps):
        for i in range(agents):
            call = r.ask(contexts[i], max_new=16)
            contexts[i] = contexts[i] + call + toks(rng, rng.randint(50, 300))  # the tool's result
    return r.result()


def ttft(engine, rng, n: int) -> dict:
    """Time to first token for an n-token prompt: cold, then the same prefix with a new 10-token turn."""
    engine.generate(input_ids=toks(rng, 16), sampling_params={"max_new_tokens": 1})  # warm-up
    prefix = toks(rng, n - 10)
    sp = {"max_new_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    engine.generate(input_ids=prefix + toks(rng, 10), sampling_params=sp)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = engine.generate(input_ids=prefix + toks(rng, 10), sampling_params=sp)
    cached = time.perf_counter() - t0
    return {"prompt_tokens": n, "cold_s": cold, "cached_s": cached, "cold_over_cached": cold / cached,
            "cached_tokens": out["meta_info"]["cached_tokens"]}  # fmt: skip


def memory(engine) -> dict:
    st = engine.get_server_info()["internal_states"][0]
    return {k: st[k] for k in st if k.startswith(("radix_", "sconv_"))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    engine = sglang.Engine(max_total_tokens=200_000)
    rng = random.Random(0)
    q = args.quick
    results = {
        "multi_turn": multi_turn(engine, rng, convs=3 if q else 8, turns=3 if q else 5),
        "shared_system": shared_system(engine, rng, users=10 if q else 100, system_len=2000, max_turn=200 if q else 2000),
        "agent_loop": agent_loop(engine, rng, agents=2 if q else 5, steps=3 if q else 6),
    }  # fmt: skip
    results["cache_state"] = memory(engine)
    engine.get_server_info()
    results["ttft_4000"] = ttft(engine, rng, 4000)
    engine.shutdown()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"benchmark": "prefix_cache", "model": "inkling-tiny", "device": "cpu", "commit": commit, **results}
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
