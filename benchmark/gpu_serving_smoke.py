"""GPU smoke test of the serving path on inkling-tiny through sglang.Engine: CUDA graphs vs eager
(same kernels, so the same greedy tokens), fp32 on CUDA vs the CPU reference, and decode speed."""

from __future__ import annotations

import json
import sys
import time

import sglang

PROMPTS = ["The quick brown fox", "In a distant galaxy", "def fibonacci(n):", "Dear diary,"]
SP = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}


def run(**kw) -> tuple[list[list[int]], float]:
    engine = sglang.Engine(**kw)
    engine.generate(PROMPTS[0], {"max_new_tokens": 2})
    t0 = time.perf_counter()
    outs = [o["output_ids"] for o in engine.generate(PROMPTS, SP)]
    dt = time.perf_counter() - t0
    engine.shutdown()
    return outs, dt


if __name__ == "__main__":
    graph, graph_s = run(device="cuda", dtype="bfloat16")
    eager, eager_s = run(device="cuda", dtype="bfloat16", disable_cuda_graph=True)
    gpu32, _ = run(device="cuda", dtype="float32")
    cpu, _ = run(device="cpu", dtype="float32")
    tokens = len(PROMPTS) * SP["max_new_tokens"]
    report = {
        "bf16_graph_equals_eager": [a == b for a, b in zip(graph, eager)],
        "fp32_cuda_equals_cpu": [a == b for a, b in zip(gpu32, cpu)],
        "batch4_tok_per_s_graph": tokens / graph_s,
        "batch4_tok_per_s_eager": tokens / eager_s,
    }
    print(json.dumps(report))
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(json.dumps(report, indent=2))
