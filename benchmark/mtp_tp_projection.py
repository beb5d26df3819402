"""TP 8 projection of decode with and without MTP for the 66-layer Inkling on H200s, from one-GPU
and TP 2 measurements (CPU only: it reads result files and builds the model on the meta device).

Inputs, all measured on the H200 with CUDA graphs:
- one GPU, inkling-slice (bench_one_batch --mtp, the adaptive table): the plain decode step and,
  per fixed k, the verify of k + 1 tokens and the draft step, each extrapolated to 66 layers as the
  benchmark does (the verify's trunk part x 22, the LM head once, the draft step as measured);
- TP 2 vs TP 1 (bench_tp): the collective time per layer, c2(b) = (TP 2 layer time) - (TP 1 layer
  time) / 2, at batch 1 (latency: 4 collectives per layer) and 64 (adds the bandwidth term);
- per-rank bytes from the sharding code (tp_projection.project: the model built at TP 8 / TP 1).

Model (labelled an approximation in the output):
- compute: bandwidth-bound, so a step's one-GPU time scales by the per-rank weight bytes at TP 8
  over TP 1 (optimistic for small kernels, whose launch and latency floors do not shrink);
- collectives: per layer, 4 x alpha + bytes per token per layer at TP 8 (the sharding code) x tokens
  x beta, with alpha and beta fitted to c2(1) and c2(64). alpha is taken as at TP 2 ("flat": the
  one-shot NVSwitch algorithms keep small-message latency about constant in the group size) and,
  as a bound, x 7 ("ring": one hop per peer). The verify moves b (k + 1) tokens per layer; a depth
  is a full decoder layer, sharded the same way: in a table without tails the draft step's 8
  depths each move b (k + 2) tokens; with tails (lagging.py, `tail_capacity` in its step costs) the
  k drafting depths do, and each of the 8 - k lagging ones moves the step's b E_k kept tokens later
  in its catch-ups (4 alpha per catch-up, tail_catch_up_rate of them a step);
- tokens per step: the expectation under the public per-depth acceptance curve for each k; MTP
  takes the best k per batch (what the adaptive chooser converges to with these costs).

    python benchmark/mtp_tp_projection.py   # writes benchmark/results/mtp_tp8_projection.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "python")]

from benchmark.tp_projection import project  # noqa: E402
from sgl_inkling.models.inkling.quant_config import NVFP4  # noqa: E402
from sgl_inkling.models.inkling.slice_config import NUM_FULL_MODEL_LAYERS, slice_config  # noqa: E402
from sgl_inkling.speculative.adaptive import (  # noqa: E402
    PUBLIC_MTP8_CURVE,
    conditional_rates,
    expected_tokens,
    tail_catch_up_rate,
)

RESULTS = ROOT / "benchmark" / "results"
ANCHOR = {"without_mtp": 140, "with_mtp": 380, "system": "vLLM day-0, 4x GB200, MTP 8, accept length 4.5"}
COLLECTIVES_PER_LAYER = 4  # two reduce-scatters and two all-gathers (tp_projection.project)
MTP_DEPTHS = 8


def collective_fit(bench_tp: dict) -> dict:
    """alpha (ms per collective) and beta (ms per byte) from the TP 2 and TP 1 layer times."""
    graph = {
        (name, r["batch_size"]): r["cuda_graph_layers_ms_per_layer"]
        for name, res in bench_tp["results"].items()
        for r in res["runs"]
    }
    c2 = {b: graph["tp2", b] - graph["tp1", b] / 2 for b in (1, 64)}
    tp2_bytes = next(p for p in bench_tp["projection_66_layers"] if p["tp"] == 2)["comm_bytes_per_token_per_layer_per_rank"]
    alpha = c2[1] / COLLECTIVES_PER_LAYER
    beta = max(c2[64] - c2[1], 0.0) / (63 * tp2_bytes)
    return {"tp2_collective_ms_per_layer": c2, "alpha_ms": alpha, "beta_ms_per_byte": beta}


def comm_ms(tokens: int, bytes_per_token: float, alpha: float, beta: float, layers: int) -> float:
    return layers * (COLLECTIVES_PER_LAYER * alpha + tokens * bytes_per_token * beta)


def draft_comm_ms(b: int, k: int, tokens: float, capacity: int, bytes8: float, alpha: float, beta: float) -> float:
    """The draft step's collectives a step drafting k (see the module note); capacity 0: no tails."""
    if not capacity:
        return comm_ms(b * (k + 2), bytes8, alpha, beta, MTP_DEPTHS)
    tail = (MTP_DEPTHS - k) * (tail_catch_up_rate(tokens, capacity) * COLLECTIVES_PER_LAYER * alpha
                               + b * tokens * bytes8 * beta)  # fmt: skip
    return comm_ms(b * (k + 2), bytes8, alpha, beta, k) + tail


def project_batch(m: dict, plain66_ms: float, scale: float, fit: dict, alpha: float, bytes8: float) -> dict:
    """One batch size: TP 8 tok/s/user without MTP and for each k, and the best k."""
    b, beta = m["batch_size"], fit["beta_ms_per_byte"]
    rates = conditional_rates(PUBLIC_MTP8_CURVE[: m["num_steps"]])
    capacity = m.get("step_costs", {}).get("tail_capacity", 0)
    plain = plain66_ms * scale + comm_ms(b, bytes8, alpha, beta, NUM_FULL_MODEL_LAYERS)
    by_k = []
    for r in m["runs"]:
        if not isinstance(r["k"], int) or r["k"] == 0:  # the adaptive runs; plain decode is `plain`
            continue
        k = r["k"]
        one_gpu = r["extrapolated_66_layers"]["step_ms"]
        comm = comm_ms(b * (k + 1), bytes8, alpha, beta, NUM_FULL_MODEL_LAYERS)
        comm += draft_comm_ms(b, k, expected_tokens(rates, k), capacity, bytes8, alpha, beta)
        step = one_gpu * scale + comm
        by_k.append({"k": k, "step_ms": step, "collective_ms": comm,
                     "tok_per_s_per_user": expected_tokens(rates, k) * 1e3 / step})  # fmt: skip
    best = max(by_k, key=lambda x: x["tok_per_s_per_user"])
    plain_tps = 1e3 / plain
    # The chooser's k = 0 is the plain step: MTP never does worse than it under this model.
    mtp_tps = max(best["tok_per_s_per_user"], plain_tps)
    return {
        "batch_size": b,
        "plain_step_ms": plain,
        "tok_per_s_per_user_without_mtp": plain_tps,
        "by_k": by_k,
        "best_k": best["k"] if best["tok_per_s_per_user"] > plain_tps else 0,
        "tok_per_s_per_user_with_mtp": mtp_tps,
        "mtp_speedup": mtp_tps / plain_tps,
    }


def run(mtp_file: Path, tp_file: Path, tp: int = 8) -> dict:
    bench = json.loads(mtp_file.read_text())
    bench_tp = json.loads(tp_file.read_text())
    quant = NVFP4 if bench.get("routed_experts") == "nvfp4" else None
    config = slice_config()
    one, many = project(config, 1, 1, quant), project(config, tp, 1, quant)
    scale = many["weights_gb_per_rank"] / one["weights_gb_per_rank"]
    fit = collective_fit(bench_tp)
    # Plain decode at 66 layers: the adaptive table's own k = 0 run where it has one (timed as its MTP
    # steps are), else the file's plain CUDA-graph decode runs.
    plain66 = {
        r["batch_size"]: 1e3 / r["extrapolated_66_layers"]["cuda_graph_tok_per_s_per_user"]
        for r in bench["runs"]
        if r.get("mode") == "kernels" and r["extrapolated_66_layers"].get("cuda_graph_tok_per_s_per_user")
    }
    plain66 |= {m["batch_size"]: 1e3 / m["plain_tok_per_s_per_user_66"]
                for m in bench["mtp_adaptive"] if m.get("plain_tok_per_s_per_user_66")}  # fmt: skip
    bytes8 = many["comm_bytes_per_token_per_layer_per_rank"]
    out = {}
    for name, alpha in (("flat", fit["alpha_ms"]), ("ring", fit["alpha_ms"] * (tp - 1))):
        out[name] = [
            project_batch(m, plain66[m["batch_size"]], scale, fit, alpha, bytes8)
            for m in bench["mtp_adaptive"]
            if m["batch_size"] in plain66
        ]
    return {
        "benchmark": "mtp_tp_projection",
        "approximation": "bandwidth-bound compute scaled by per-rank bytes; collectives fitted to TP 2 (module docstring)",
        "tp": tp,
        "ep": 1,
        "routed_experts": bench.get("routed_experts"),
        "sources": {
            "mtp": {"file": mtp_file.name, "git_commit": bench.get("git_commit")},
            "tp": {"file": tp_file.name, "git_commit": bench_tp.get("git_commit")},
        },
        "per_rank_weight_bytes_tp_over_tp1": scale,
        "comm_bytes_per_token_per_layer_per_rank": bytes8,
        "collective_fit": fit,
        "acceptance_curve": list(PUBLIC_MTP8_CURVE),
        "anchor_tok_per_s_per_user": ANCHOR,
        "latency_models": out,
    }


def main(argv: list[str] | None = None) -> dict:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--mtp-file", type=Path, default=RESULTS / "bench_one_batch_mtp_adaptive_nvfp4_map32k_inkling-slice.json")
    a.add_argument("--tp-file", type=Path, default=RESULTS / "bench_tp_inkling-slice_cuda.json")
    a.add_argument("--tp", type=int, default=8)
    a.add_argument("--result-file", type=Path, default=RESULTS / "mtp_tp8_projection.json")
    args = a.parse_args(argv)
    result = run(args.mtp_file, args.tp_file, args.tp)
    args.result_file.write_text(json.dumps(result, indent=1))
    print(f"TP {args.tp} projection ({result['routed_experts']} experts), tok/s/user; anchor "
          f"{ANCHOR['without_mtp']} without MTP, {ANCHOR['with_mtp']} with")  # fmt: skip
    print(f"{'collectives':>11} {'bs':>3} {'plain':>7} {'MTP':>7} {'best k':>6} {'x':>5}")
    for name, rows in result["latency_models"].items():
        for r in rows:
            print(f"{name:>11} {r['batch_size']:>3} {r['tok_per_s_per_user_without_mtp']:>7.1f} "
                  f"{r['tok_per_s_per_user_with_mtp']:>7.1f} {r['best_k']:>6} {r['mtp_speedup']:>5.2f}")  # fmt: skip
    print(f"wrote {args.result_file}")
    return result


if __name__ == "__main__":
    main()
