"""Serve inkling-slice with dummy NVFP4 routed experts through sglang.Engine on the GPU (CUDA graphs on):
the deployed checkpoint's weight format end to end. Greedy tokens must be valid ids and identical across
two runs of the same batch (graph replay is deterministic; the prefix cache is off so the second run
recomputes the same way: a cached resume takes other kernels, and with random weights bf16 near-ties flip); reports decode tok/s. Writes JSON."""

from __future__ import annotations

import json
import sys
import time

import sglang
from benchmark.bench_one_batch import git_commit
from benchmark.slice_dir import write_slice_dir

PROMPTS = [[100 + 7 * i + j for j in range(64 + 16 * i)] for i in range(4)]
SP = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}

if __name__ == "__main__":
    out_path = sys.argv[1]
    engine = sglang.Engine(model_path=str(write_slice_dir()), load_format="dummy", quantization="modelopt_fp4",
                           device="cuda", dtype="bfloat16", cuda_graph_max_bs=8, max_total_tokens=16384,
                           disable_radix_cache=True)  # fmt: skip
    info = engine.get_server_info() if hasattr(engine, "get_server_info") else {}
    engine.generate(input_ids=PROMPTS[0], sampling_params={"max_new_tokens": 2})
    runs = []
    for _ in range(2):
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=PROMPTS, sampling_params=SP)
        runs.append(([o["output_ids"] for o in outs], time.perf_counter() - t0))
    engine.shutdown()
    ids = runs[0][0]
    vocab = 200058
    report = {
        "benchmark": "gpu_nvfp4_serve_check",
        "quantization": info.get("quantization", "modelopt_fp4"),
        "batch": len(PROMPTS),
        "new_tokens": SP["max_new_tokens"],
        "valid_ids": all(0 <= t < vocab for seq in ids for t in seq),
        "repeat_identical": runs[0][0] == runs[1][0],
        "distinct_tokens": len({t for seq in ids for t in seq}),
        "seconds": [r[1] for r in runs],
        "tok_per_s": len(PROMPTS) * SP["max_new_tokens"] / runs[1][1],
        "git_commit": git_commit()[0],
    }
    json.dump(report, open(out_path, "w"), indent=2)
    print(json.dumps(report))
    sys.exit(0 if report["valid_ids"] and report["repeat_identical"] else 1)
