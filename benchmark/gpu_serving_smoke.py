"""GPU smoke test of the serving path: inkling-tiny through sglang.Engine on CUDA (bf16, triton
attention) vs the same engine on the CPU in fp32; prints token agreement and decode speed."""

from __future__ import annotations

import json
import sys
import time

import sglang

PROMPTS = ["The quick brown fox", "In a distant galaxy", "def fibonacci(n):"]
SP = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}


def run(**kw) -> tuple[list[list[int]], float]:
    engine = sglang.Engine(**kw)
    engine.generate(PROMPTS[0], {"max_new_tokens": 2})
    t0 = time.perf_counter()
    outs = [engine.generate(p, SP)["output_ids"] for p in PROMPTS]
    dt = time.perf_counter() - t0
    engine.shutdown()
    return outs, dt


if __name__ == "__main__":
    gpu, gpu_s = run(device="cuda", dtype="bfloat16", attention_backend="triton")
    gpu32, _ = run(device="cuda", dtype="float32", attention_backend="triton")
    cpu, _ = run(device="cpu", dtype="float32")
    same32 = [a == b for a, b in zip(gpu32, cpu)]
    prefix_bf16 = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(gpu, cpu)]
    report = {"fp32_cuda_equals_cpu": same32, "bf16_tokens_agreeing_before_first_difference": prefix_bf16,
              "bf16_cuda_tokens_per_s_sequential": 3 * 32 / gpu_s}  # fmt: skip
    print(json.dumps(report))
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(json.dumps(report, indent=2))
