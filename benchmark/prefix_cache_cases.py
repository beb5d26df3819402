"""Workloads of bench_prefix_cache.py. Each returns what the cache served against the ideal.

ideal = for each request, the longest prefix of its prompt that earlier requests already computed
(their prompts and answers), capped at len - 1 (the last prompt token is always computed) and, for
prompt-logprob requests, at logprob_start_len - 1.
"""

from __future__ import annotations

import random
import statistics
import time

from sgl_inkling.mem_cache.radix_cache import common_prefix_len

GREEDY = {"temperature": 0, "ignore_eos": True}


def toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(0, 199_990) for _ in range(n)]


def state(engine) -> dict:
    return engine.get_server_info()["internal_states"][0]


class Runner:
    """Sends requests and tallies cached vs ideal tokens, per request and in total."""

    def __init__(self, engine):
        self.engine = engine
        self.history: list[list[int]] = []
        self.rows: list[tuple[int, int, int]] = []  # (prompt tokens, cached, ideal)

    def ideal(self, prompt: list[int], cap: int) -> int:
        return min(max((common_prefix_len(prompt, h) for h in self.history), default=0), cap)

    def ask_many(self, prompts: list[list[int]], max_new: int = 8, **kw) -> list[list[int]]:
        """One batch (concurrent requests); the ideal counts only what came before the batch."""
        start = kw.get("logprob_start_len", -1)
        caps = [(start if start > 0 else len(p)) - 1 for p in prompts]
        ideals = [self.ideal(p, c) for p, c in zip(prompts, caps)]
        outs = self.engine.generate(
            input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": max_new}, **kw
        )
        for p, o, i in zip(prompts, outs, ideals):
            self.rows.append((len(p), o["meta_info"]["cached_tokens"], i))
            self.history.append(p + o["output_ids"])
        return [o["output_ids"] for o in outs]

    def ask(self, prompt: list[int], max_new: int = 8, **kw) -> list[int]:
        return self.ask_many([prompt], max_new, **kw)[0]

    def result(self, detail: bool = False) -> dict:
        cached = sum(r[1] for r in self.rows)
        ideal = sum(r[2] for r in self.rows)
        out = {
            "requests": len(self.rows),
            "prompt_tokens": sum(r[0] for r in self.rows),
            "ideal_cached_tokens": ideal,
            "cached_tokens": cached,
            "fraction_of_ideal": cached / ideal if ideal else 1.0,
        }
        if detail:
            out["per_request"] = [{"prompt": p, "cached": c, "ideal": i} for p, c, i in self.rows]
        return out


def exact_resume(engine, rng, n: int) -> dict:
    """Repeat x3, a strict prefix (twice), a prompt ending on a divergence node, prompt logprobs."""
    out = {}
    r = Runner(engine)
    p = toks(rng, n)
    for _ in range(3):
        r.ask(p)
    out["repeat_x3"] = r.result(detail=True)
    r = Runner(engine)
    r.history.append(p)
    q = p[: n * 4 // 5]
    r.ask(q)
    r.ask(q)
    out["strict_prefix_x2"] = r.result(detail=True)
    r = Runner(engine)
    base = toks(rng, n * 3 // 4)
    for tail in (40, 60, 0):
        r.ask(base + toks(rng, tail))
    out["node_boundary"] = r.result(detail=True)
    r = Runner(engine)
    lp = toks(rng, n)
    start = n * 3 // 4
    for prompt in (lp, lp, lp[:start] + toks(rng, n // 8)):  # as `select` sends its choices
        r.ask(prompt, max_new=0, return_logprob=True, logprob_start_len=start)
    out["prompt_logprobs"] = r.result(detail=True)
    return out


def shared_prefix(engine, rng, prefix: int, turns: int, lo: int, hi: int) -> dict:
    """One long system prompt, then `turns` different long user turns (sequential)."""
    r = Runner(engine)
    system = toks(rng, prefix)
    for _ in range(turns + 1):
        r.ask(system + toks(rng, rng.randint(lo, hi)), max_new=1)
    res = r.result(detail=True)
    res["min_cached_after_first"] = min(c for _, c, _ in r.rows[1:])
    return res


def follow_ups(engine, rng, convs: int, lo: int, hi: int) -> dict:
    """`convs` concurrent first turns, then all their follow-ups at once: does each follow-up
    resume at the end of its first turn, and when not, did eviction take that turn's KV?"""
    r = Runner(engine)
    firsts = [toks(rng, rng.randint(lo, hi)) for _ in range(convs)]
    outs = r.ask_many(firsts)
    before = state(engine)
    r.rows.clear()
    r.ask_many([p + o + toks(rng, 50) for p, o in zip(firsts, outs)])
    after = state(engine)
    ends = [len(p) + len(o) - 1 for p, o in zip(firsts, outs)]
    res = r.result()
    res["follow_ups_at_turn_end"] = sum(c == e for (_, c, _), e in zip(r.rows, ends))
    res["follow_ups"] = convs
    for k in ("radix_evicted_end_checkpoints", "radix_thinned_checkpoints", "radix_thinned_swa_tokens",
              "radix_end_checkpoints_missing", "radix_snapshots_skipped"):  # fmt: skip
        res[k] = after[k] - before[k]
    return res


def multi_turn(engine, rng, convs: int, turns: int) -> dict:
    r = Runner(engine)
    prompts = [toks(rng, rng.randint(20, 200)) for _ in range(convs)]
    for _ in range(turns):
        for i in range(convs):  # interleaved, as concurrent users would be
            out = r.ask(prompts[i], max_new=rng.randint(8, 24))
            prompts[i] = prompts[i] + out + toks(rng, rng.randint(10, 80))
    return r.result()


def agent_loop(engine, rng, agents: int, steps: int) -> dict:
    r = Runner(engine)
    contexts = [toks(rng, 300) + toks(rng, rng.randint(30, 90)) for _ in range(agents)]
    for _ in range(steps):
        for i in range(agents):
            call = r.ask(contexts[i], max_new=16)
            contexts[i] = contexts[i] + call + toks(rng, rng.randint(50, 300))  # the tool's result
    return r.result()


def ttft(engine, rng, n: int, repeats: int) -> dict:
    """Time to first token of an n-token prompt: cold, then the same prefix with new 10-token turns:
    the first such request (the length is new to the server) and the median of `repeats` more.
    A warm-up at another length runs the same path first (cold, cached, repeat)."""
    sp = {"max_new_tokens": 1, "temperature": 0}
    warm = toks(rng, n // 2 + 3)
    for ids in (warm, warm[:-10] + toks(rng, 10), warm):
        engine.generate(input_ids=ids, sampling_params=sp)

    def timed(ids: list[int]) -> tuple[float, int]:
        t0 = time.perf_counter()
        out = engine.generate(input_ids=ids, sampling_params=sp)
        return time.perf_counter() - t0, out["meta_info"]["cached_tokens"]

    prefix = toks(rng, n - 10)
    cold, _ = timed(prefix + toks(rng, 10))
    first, first_cached = timed(prefix + toks(rng, 10))
    rest = [timed(prefix + toks(rng, 10)) for _ in range(repeats)]
    cached = statistics.median(t for t, _ in rest)
    return {"prompt_tokens": n, "cold_s": cold, "cached_first_s": first, "cached_s": cached,
            "cold_over_cached": cold / cached, "cached_tokens_first": first_cached,
            "cached_tokens": rest[-1][1]}  # fmt: skip
