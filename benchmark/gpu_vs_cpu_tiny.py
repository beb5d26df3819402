"""Greedy inkling-tiny on the GPU (CUDA graphs, Triton kernels) against the CPU eager path.

    python benchmark/gpu_vs_cpu_tiny.py --device cpu  --out ref.json         # here: the reference
    python benchmark/gpu_vs_cpu_tiny.py --device cuda --ref ref.json --out result.json   # on the GPU

float32 on the GPU must give the CPU's tokens; bfloat16 is reported: where a sequence first leaves
the reference, and the reference's top-2 logprob gap there (a near-tie means rounding, not a bug).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 199_990, (5 + 23 * i,), generator=g).tolist() for i in range(8)]


def generate(device: str, dtype: str) -> list[dict]:
    import sglang as sgl

    eng = sgl.Engine(device=device, dtype=dtype, random_seed=0)
    try:
        params = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
        outs = eng.generate(input_ids=prompts(), sampling_params=params, return_logprob=True, top_logprobs_num=2)
    finally:
        eng.shutdown()
    return [{"ids": o["output_ids"], "top2": [[t[0][0], t[1][0]] for t in o["meta_info"]["output_top_logprobs"]]}
            for o in outs]  # fmt: skip


def compare(ref: list[dict], got: list[dict]) -> dict:
    out = {"sequences": len(ref), "identical": 0, "diverged": []}
    for r, g in zip(ref, got):
        if r["ids"] == g["ids"]:
            out["identical"] += 1
            continue
        j = next(i for i, (a, b) in enumerate(zip(r["ids"], g["ids"])) if a != b)
        out["diverged"].append({"at": j, "ref_top2_gap": r["top2"][j][0] - r["top2"][j][1]})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--ref", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.device == "cpu":
        args.out.write_text(json.dumps(generate("cpu", "float32")))
        return
    ref = json.loads(args.ref.read_text())
    result = {
        "benchmark": "gpu_vs_cpu_tiny",
        "git_commit": os.environ.get("GIT_COMMIT", "unknown"),
        "gpu": torch.cuda.get_device_name(0),
        "reference": "CPU, float32, eager (torch_native), same prompts",
        "gpu_float32": compare(ref, generate("cuda", "float32")),
        "gpu_bfloat16": compare(ref, generate("cuda", "bfloat16")),
    }
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
