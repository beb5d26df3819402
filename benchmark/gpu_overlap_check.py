"""Overlap scheduling on the GPU (issue 20 item 2): HTTP TPOT at concurrency 1 with overlap on (the
default) and with --disable-overlap-schedule, beside the engine's own decode step (bench_one_batch,
batch 1, CUDA graph, same prompt length) from the same run. Goal: TPOT with overlap within 8% of
the graph step.

    python benchmark/gpu_overlap_check.py results/overlap.json            # H200: inkling-slice, 8K in
    python benchmark/gpu_overlap_check.py /tmp/o.json --smoke              # CPU: inkling-tiny, tiny lengths

The servers are started by bench_serving --launch-server (dummy weights), one after the other;
bench_one_batch runs first in a child process so its memory is gone before a server starts. Writes
one JSON (with the commit) to the path given and prints a short table. Budget: under 3 minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from benchmark import bench_serving  # noqa: E402
from benchmark.bench_one_batch import git_commit  # noqa: E402

GOAL = 1.08  # TPOT at most 8% above the engine's graph step


def engine_step_ms(args, work: Path) -> tuple[float, str]:
    """bench_one_batch at batch 1: the graph step on CUDA, the eager one on CPU."""
    out = work / "one_batch.json"
    cmd = [sys.executable, str(ROOT / "benchmark" / "bench_one_batch.py"), "--batch-size", "1",
           "--input-len", str(args.input_len), "--decode-steps", "20", "--prefill-repeats", "1",
           "--result-file", str(out)]  # fmt: skip
    cmd += ["--config", "tiny", "--device", "cpu"] if args.smoke else ["--config", "slice", "--cuda-graph",
                                                                         "--fast-path", "kernels"]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT)
    run = json.loads(out.read_text())["runs"][0]
    if run.get("cuda_graph_step_ms"):
        return run["cuda_graph_step_ms"], "cuda_graph_step_ms"
    return run["decode_step_ms"], "decode_step_ms (eager: no CUDA graph on this device)"


def serve(args, work: Path, overlap: bool) -> dict:
    name = "overlap" if overlap else "sync"
    server = ["--device", "cpu"] if args.smoke else [
        "--model-path", "inkling-slice", "--max-running-requests", "8", "--cuda-graph-max-bs", "8",
        "--max-total-tokens", str(4 * (args.input_len + args.output_len)),
    ]  # fmt: skip
    if not overlap:
        server.append("--disable-overlap-schedule")
    result = bench_serving.main([
        "--launch-server", "--max-concurrency", "1", "--num-prompts", str(args.num_prompts),
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--output-file", str(work / f"serving_{name}.json"), "--note", f"gpu_overlap_check: {name}", "--", *server,
    ])  # fmt: skip
    run = result["runs"][0]
    keys = ("completed", "num_prompts", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_ttft_ms",
            "median_itl_ms", "output_throughput")  # fmt: skip
    return {k: run[k] for k in keys}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", type=Path, help="where the JSON goes")
    p.add_argument("--smoke", action="store_true", help="CPU smoke test: inkling-tiny, tiny lengths")
    p.add_argument("--input-len", type=int, default=None, help="default 8192 (smoke: 32)")
    p.add_argument("--output-len", type=int, default=None, help="default 512 (smoke: 6)")
    p.add_argument("--num-prompts", type=int, default=None, help="default 3 (smoke: 2)")
    args = p.parse_args(argv)
    args.input_len = args.input_len or (32 if args.smoke else 8192)
    args.output_len = args.output_len or (6 if args.smoke else 512)
    args.num_prompts = args.num_prompts or (2 if args.smoke else 3)
    commit, dirty = git_commit()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        step, step_kind = engine_step_ms(args, work)
        runs = {"overlap": serve(args, work, True), "sync": serve(args, work, False)}
    report = {
        "benchmark": "gpu_overlap_check",
        "git_commit": commit,
        "git_dirty": dirty,
        "gpu": bench_serving.gpu_name(),
        "model": "inkling-tiny" if args.smoke else "inkling-slice",
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_prompts": args.num_prompts,
        "concurrency": 1,
        "engine_step_ms": step,
        "engine_step_kind": step_kind,
        "serving": runs,
        "tpot_over_step": {k: r["mean_tpot_ms"] / step for k, r in runs.items()},
        "goal_tpot_over_step": GOAL,
    }
    report["goal_met"] = report["tpot_over_step"]["overlap"] <= GOAL
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(f"\nengine step ({step_kind.split()[0]}): {step:.3f} ms, {args.input_len} in / {args.output_len} out, "
          f"concurrency 1, {args.num_prompts} prompts")  # fmt: skip
    print(f"{'schedule':>9} {'TPOT mean':>10} {'TPOT p99':>9} {'ITL med':>8} {'TTFT':>9} {'TPOT/step':>10}")
    for k, r in runs.items():
        print(f"{k:>9} {r['mean_tpot_ms']:>10.3f} {r['p99_tpot_ms']:>9.3f} {r['median_itl_ms']:>8.3f} "
              f"{r['mean_ttft_ms']:>9.1f} {report['tpot_over_step'][k]:>10.3f}")  # fmt: skip
    print(f"goal: overlap TPOT/step <= {GOAL} -> {'met' if report['goal_met'] else 'NOT met'}; wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
