"""Render the README's results tables (Markdown) from the JSON files the benchmarks write.

    python benchmark/results_table.py                       # benchmark/results/*.json, GPU runs only
    python benchmark/results_table.py DIR_OR_FILES... --include-cpu
    python benchmark/results_table.py --readme README.md    # replace the block between the markers

Tables: decode latency against the bandwidth floor (bench_one_batch), MTP speculative decoding at
forced acceptance lengths (bench_one_batch --mtp), our runtime against the transformers port
(bench_one_batch vs bench_peer, same config), and serving throughput and latency (bench_serving). Of several files of one kind and config, the newest (by its timestamp) is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("bench_one_batch", "bench_peer", "bench_serving", "bench_moe_nvfp4")
START, END = "<!-- bench-results:start -->", "<!-- bench-results:end -->"


def run_key(kind: str, run: dict):
    return {"bench_one_batch": (run.get("batch_size"), run.get("mode")), "bench_peer": run.get("batch_size")}.get(kind)


def load(paths: list[Path], include_cpu: bool) -> dict[tuple[str, str, str], dict]:
    """One result per (benchmark, config): the newest file's, with the runs of older files added where
    the newest lacks that batch size (bench_one_batch and bench_peer run one batch size per file on
    the GPU). Serving runs are not mixed across files (their lengths may differ)."""
    files = [f for p in paths for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    found: dict[tuple[str, str, str], list[dict]] = {}
    for f in files:
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(d, dict) or d.get("benchmark") not in KINDS or not (d.get("runs") or d.get("results")):
            continue
        if not include_cpu and not d.get("gpu"):
            continue
        # Cards are never mixed: an H100 run and an H200 run of one config are two tables.
        found.setdefault((d["benchmark"], config_of(d), d.get("gpu") or ""), []).append(d)
    merged = {}
    for (kind, cfg, gpu), ds in found.items():
        ds.sort(key=lambda d: d.get("timestamp", ""))
        out = dict(ds[-1])
        if kind not in ("bench_serving", "bench_moe_nvfp4"):
            runs = {run_key(kind, r): r for d in ds for r in d["runs"]}  # newer files overwrite older
            out["runs"] = list(runs.values())
            out["sources"] = [d.get("timestamp") for d in ds]
            # Rows may come from older files (batch sizes the newest lacks): name every commit.
            out["source_commits"] = list(dict.fromkeys(str(d.get("git_commit"))[:8] for d in reversed(ds)))
            for key in ("mtp", "mtp_adaptive"):  # by batch size, newer files first
                by_bs = {m["batch_size"]: m for d in ds for m in d.get(key) or []}
                out[key] = [by_bs[b] for b in sorted(by_bs)]
        merged[(kind, cfg, gpu)] = out
    return merged


def config_of(d: dict) -> str:
    if d.get("benchmark") == "bench_moe_nvfp4":
        c = d["config"]
        return f"H {c['hidden']}, I {c['inter']}, {c['experts']} experts, top-{c['top_k']}, {c['sinks']} sinks"
    if "config" in d:
        vocab = d.get("mtp_token_map_size")  # MTP drafting over a subset of the vocabulary: a table of its own
        return d["config"] + (f", {vocab}-token draft vocabulary" if vocab else "")
    server = d.get("server_args", {})
    name = str(server.get("served_model_name") or "?")
    if server.get("speculative_algorithm"):  # MTP serving is a table of its own, never the plain one
        name += f", {server['speculative_algorithm']} {'adaptive' if server.get('speculative_adaptive') else 'fixed'}"
    mixed = d.get("enable_mixed_chunk")  # runs with and without --enable-mixed-chunk are two tables
    return name if mixed is None else f"{name}, mixed chunk {'on' if mixed else 'off'}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def f(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def source(d: dict) -> str:
    commits = d.get("source_commits") or [str(d.get("git_commit"))[:8]]
    label = "commit" if len(commits) == 1 else "commits (newest first)"
    return f"{d['benchmark']}, {d.get('gpu') or d.get('device', 'cpu')}, {label} {', '.join(commits)}, {d.get('timestamp')}"


def plain_tok_per_s_66(run: dict) -> float | None:
    """A decode run's 66-layer tok/s/user from its CUDA-graph timings (bench_one_batch.graph_tok_per_s_66,
    recomputed here so files written before that formula read the same way), else the eager figure."""
    from benchmark.bench_one_batch import graph_tok_per_s_66  # torch: only where there is a decode table

    per_layer = run.get("cuda_graph_layers_ms_per_layer")
    graph = graph_tok_per_s_66(run.get("cuda_graph_step_ms"), per_layer and per_layer * len(run["layers"]), run["layers"])
    e = run["extrapolated_66_layers"]
    return graph or e.get("cuda_graph_tok_per_s_per_user") or e["tok_per_s_per_user"]


def best_step_ms(run: dict) -> float:
    return run.get("cuda_graph_step_ms") or run["decode_step_ms"]


def decode_table(d: dict) -> str:
    rows = []
    for r in sorted(d["runs"], key=lambda r: (r["batch_size"], r["mode"])):
        e = r["extrapolated_66_layers"]
        graph = r.get("cuda_graph_step_ms")
        rows.append([
            r["mode"], str(r["batch_size"]), f(r["prefill_ms"], ".1f"), f(r["decode_step_ms"], ".3f"), f(graph, ".3f"),
            f(r["decode_step_floor_ms"], ".3f"), f(100 * r["decode_step_floor_ms"] / best_step_ms(r), ".0f") + "%",
            " ".join(f"{x['kind'][0]}{100 * x['achieved_fraction']:.0f}%" for x in r["layers"]),
            f(plain_tok_per_s_66(r), ".1f"),
            f(e["floor_tok_per_s_per_user"], ".1f"),
        ])  # fmt: skip
    header = ["mode", "batch", "prefill ms", "step ms (eager)", "step ms (CUDA graph)", "floor ms",
              "floor / best", "per layer floor / eager time", "tok/s/user @66 layers", "floor tok/s/user"]  # fmt: skip
    peak = d.get("bandwidth_bytes_per_s", 4.3e12) / 1e12  # benchmark/hbm_ceiling.py: the card's ceiling
    return f"Decode latency, {d['config']}, floors at {peak:.2f} TB/s (source: {source(d)}):\n\n" + table(header, rows)


def mtp_table(d: dict) -> str:
    """Per batch size and forced acceptance length: both steps from their CUDA graphs against their
    floors, and tok/s/user at 66 layers against plain decode of the same batch size."""
    plain = {r["batch_size"]: plain_tok_per_s_66(r) for r in d["runs"] if r["mode"] == "kernels"}
    rows = []
    for m in d["mtp"]:
        # Plain decode timed as the MTP runs are (k = 0) where the run has it, else the decode table's.
        base_tps = m.get("plain_tok_per_s_per_user_66") or plain.get(m["batch_size"])
        verify = (m.get("verify_cuda_graph") or {}).get("ms")
        for r in m["runs"]:
            e = r["extrapolated_66_layers"]
            chain = (r.get("draft_chain_cuda_graph") or {}).get("ms")
            tps = e.get("cuda_graph_tok_per_s_per_user") or e["tok_per_s_per_user"]
            rows.append([
                str(m["batch_size"]), f(r["forced_accept_length"], ".1f"), f(verify, ".2f"), f(r["verify_floor_ms"], ".2f"),
                f(chain, ".2f"), f(r["draft_chain_floor_ms"], ".2f"), f(tps, ".1f"), f(base_tps, ".1f"),
                f(tps / base_tps, ".2f") + "x" if base_tps else "-",
            ])  # fmt: skip
    header = ["batch", "accept length (forced)", "verify ms (graph)", "verify floor ms", "draft step ms (graph)",
              "draft floor ms", "tok/s/user @66", "plain tok/s/user @66", "speed-up"]  # fmt: skip
    return (f"MTP, {d['config']}, 8 depths; the accepted length is forced (a benchmark-only switch: dummy "
            f"weights draft nothing right) (source: {source(d)}):\n\n" + table(header, rows))


def adaptive_table(d: dict) -> str:
    """Per batch size: the best fixed number of drafts against the adaptive chooser, at 66 layers, under
    the forced per-depth acceptance curve (bench_one_batch --mtp, benchmark/mtp_adaptive.py)."""
    from benchmark.mtp_adaptive import from_choices  # torch: only where there is an adaptive table

    plain = {r["batch_size"]: plain_tok_per_s_66(r) for r in d["runs"] if r["mode"] == "kernels"}
    rows = []
    for m in d["mtp_adaptive"]:
        # Plain decode timed as the MTP runs are (k = 0) where the run has it, else the decode table's.
        base_tps = m.get("plain_tok_per_s_per_user_66") or plain.get(m["batch_size"])
        by_k = {r["k"]: r for r in m["runs"]}
        best, ad = by_k[m["best_fixed_k"]], by_k["adaptive"]
        used = ", ".join(f"{k}: {n}" for k, n in sorted(ad["k_used"].items(), key=lambda kv: -kv[1]))
        tps = lambda r: r["extrapolated_66_layers"]["tok_per_s_per_user"]  # noqa: E731
        chosen = from_choices(m["runs"], "adaptive", m["benchmark_only_forced_acceptance_curve"])
        chosen_ratio = chosen / tps(best) if chosen else None
        rows.append([
            str(m["batch_size"]), str(m["best_fixed_k"]), f(tps(best), ".1f"), used, f(ad["tokens_per_step"], ".2f"),
            f(tps(ad), ".1f"), f(m["adaptive_vs_best_fixed"], ".3f"), f(chosen_ratio, ".3f"),
            f(m.get("adaptive_long_run_vs_best_fixed"), ".3f"), f(m.get("learned_vs_best_fixed"), ".3f"),
            f(m.get("learned_long_run_vs_best_fixed"), ".3f"), f(base_tps, ".1f"),
            f((chosen or tps(ad)) / base_tps, ".2f") + "x" if base_tps else "-",
        ])  # fmt: skip
    header = ["batch", "best fixed k", "its tok/s/user @66", "adaptive k used (steps)", "adaptive tok/step",
              "adaptive tok/s/user @66 (timed)", "timed / best", "its choices / best", "long run / best",
              "learned from flat prior / best", "learned, long run / best",
              "plain tok/s/user @66", "adaptive speed-up (its choices)"]  # fmt: skip
    curve = ", ".join(f"{x:g}" for x in d["mtp_adaptive"][0]["benchmark_only_forced_acceptance_curve"])
    return (f"Adaptive MTP, {config_of(d)}: drafts accepted at the forced per-depth curve {curve} (a "
            f"benchmark-only switch), every fixed k = 0..8 against the chooser; \"its choices\": the k it chose "
            f"in its timed steps, each at the fixed-k run's step time; \"long run\": the chooser alone on the host "
            f"for thousands of steps, charged the same times (source: {source(d)}):\n\n"
            + table(header, rows))


def peer_table(ours: dict | None, peer: dict) -> str:
    by_bs = {}
    for r in (ours or {}).get("runs", []):
        if r["batch_size"] not in by_bs or best_step_ms(r) < best_step_ms(by_bs[r["batch_size"]]):
            by_bs[r["batch_size"]] = r
    rows = []
    for p in sorted(peer["runs"], key=lambda r: r["batch_size"]):
        # Same batch when we ran it; else our largest (output tok/s is then the comparable figure).
        o = by_bs.get(p["batch_size"]) or (by_bs[max(by_bs)] if by_bs else None)
        o_ms = best_step_ms(o) if o else None
        o_tps = o["batch_size"] * 1e3 / o_ms if o else None
        same = o is not None and o["batch_size"] == p["batch_size"]
        rows.append([
            str(p["batch_size"]), f(p["decode_step_ms"]), f(p["output_tok_per_s"], ".1f"),
            str(o["batch_size"]) if o else "-", f(o_ms, ".3f"), f(o_tps, ".1f"),
            f(p["decode_step_ms"] / o_ms, ".1f") + "x" if same else "-",
            f(o_tps / p["output_tok_per_s"], ".1f") + "x" if o else "-",
        ])  # fmt: skip
    oom = peer.get("out_of_memory_batch_sizes") or {}
    note = f" The port ran out of memory at batch {sorted({b for v in oom.values() for b in v})}." if oom else ""
    header = ["port batch", "port ms/step", "port out tok/s", "our batch", "our ms/step", "our out tok/s",
              "speed-up per user", "speed-up out tok/s"]  # fmt: skip
    return (f"Against the transformers port, {peer['config']} (eager generate, decode step = "
            f"(generate(N+k) - generate(N)) / k; source: {source(peer)}).{note}\n\n" + table(header, rows))  # fmt: skip


def serving_table(d: dict) -> str:
    runs = sorted(d["runs"], key=lambda r: r["max_concurrency"])  # gpu_serving.sh runs 64 first
    rows = [[
        str(r["max_concurrency"]), f"{r['completed']}/{r['num_prompts']}", f(r["output_throughput"], ".1f"),
        f(r["request_throughput"], ".2f"), f(r["mean_ttft_ms"], ".1f"), f(r["p99_ttft_ms"], ".1f"),
        f(r["mean_tpot_ms"]), f(r["p99_tpot_ms"]), f(r["median_itl_ms"]), f(r["p99_itl_ms"]),
    ] for r in runs]  # fmt: skip
    note = f" {d['note']}" if d.get("note") else ""
    header = ["concurrency", "ok", "out tok/s", "req/s", "TTFT mean ms", "TTFT p99 ms", "TPOT mean ms",
              "TPOT p99 ms", "ITL median ms", "ITL p99 ms"]  # fmt: skip
    if any(r.get("back_to_back") for r in runs):  # beside each level: the engine's own figure
        header += ["back-to-back tok/s", "served / b2b", "TTFT p99 / all prefills"]
        for row, r in zip(rows, runs):
            b = r.get("back_to_back") or {}
            row += [f(b.get("output_throughput"), ".1f"), f(r.get("output_throughput_over_back_to_back")),
                    f(r.get("p99_ttft_over_prefill_all"))]  # fmt: skip
    return (f"Serving through HTTP, {config_of(d)}: {d['random_input_len']}-token prompts, "
            f"{d['random_output_len']}-token outputs, seeded random ids.{note} (source: {source(d)})\n\n"
            + table(header, rows))  # fmt: skip


def _is_build(tiles: dict, build: str, default: str, spec_of) -> bool:
    if build == default:
        return tiles.get("path") == default
    return tiles.get("path") == "cuda" and tiles.get("nt", 1) == 1 and spec_of(tiles) == build


def _changed_fields(spec: str, default: str, ran: dict) -> str:
    """A build spec (moe_build.spec_of) as the fields where it differs from the run's default build
    (`ran`: the fields the run recorded of it, over the shipped build's)."""
    if spec == default:
        return spec
    from benchmark.moe_build import parse

    shipped, tiles = vars(parse("")), parse(spec)
    base = {k: ran.get(k, v) for k, v in shipped.items()}
    diff = [f"{k}={getattr(tiles, k)}" for k in base if getattr(tiles, k) != base[k]]
    return ",".join(diff) or default


def moe_table(d: dict) -> str:
    """The fused NVFP4 MoE alone, for the shipped default build (what the code serves with) against
    4.3 TB/s and the measured read ceiling, beside the sweep's fastest variant (benchmark/moe_build.py
    --pick), and the row-block GEMV path (the previous decode default) where the run timed it."""
    sys.path[:0] = [str(ROOT)]
    from benchmark.moe_build import DEFAULT, parse, pick, spec_of

    ceiling = d.get("bf16_linear_read_tb_s")
    # The fastest build, named by the fields where it differs from the run's own default (recorded
    # since the row ring became the default; older runs' default was the chunk ring, row_ring=0).
    ran = d.get("default_build") or {"row_ring": 0}
    build, best = DEFAULT, _changed_fields(pick(d), DEFAULT, ran)
    # A run whose default dispatch is not the build shipped now, but which timed that build as a
    # variant, shows the variant: the table is of what the code serves with.
    shipped = {"path": "cuda", **vars(parse(""))}
    differs = any(ran.get(k, v) != v for k, v in shipped.items() if k not in ("path", "nt"))
    if differs and any(_is_build(v["tiles"], spec_of(shipped), DEFAULT, spec_of) for r in d["results"]
                       for v in r["variants"] if "ms" in v):  # fmt: skip
        build = spec_of(shipped)
    rows = []
    for r in d["results"]:
        ok = [v for v in r["variants"] if "ms" in v]
        used = [v for v in ok if _is_build(v["tiles"], build, DEFAULT, spec_of)]
        gemv = min((v for v in ok if v["tiles"].get("path") == "gemv"), key=lambda v: v["ms"], default=None)
        if not used:
            continue
        u = used[0]
        rows.append([
            str(r["batch_size"]), f(r["distinct_experts_per_call"], ".1f"), f(r["bytes_routed_plus_sinks"] / 1e6, ".0f"),
            f(u["ms"] * 1e3, ".1f"), f(u["tb_s"]), f(u.get("fraction_of_peak", u.get("fraction_of_4.3")), ".0%"),
            f(u["tb_s"] / ceiling, ".0%") if ceiling else "-", f(u["routed_only_tb_s"]), f(u["sinks_only_tb_s"]),
            f(max(v["tb_s"] for v in ok)), f(gemv["tb_s"]) if gemv else "-",
        ])  # fmt: skip
    header = ["batch", "experts hit", "MB", "us", "TB/s", "of peak", "of read ceiling", "routed alone TB/s",
              "sinks alone TB/s", "best variant TB/s", "GEMV path TB/s"]  # fmt: skip
    if build != DEFAULT:
        default = (f"the shipped build ({_changed_fields(build, DEFAULT, ran)}: where it differs from that run's "
                   "default dispatch), timed as one of the run's variants")
    else:
        default = "the default build of that commit" if "default_build" not in d else "the default build"
        default += f" (row_ring={ran.get('row_ring')})"
    return (f"Fused NVFP4 MoE (routed W4A16 + BF16 sinks), {config_of(d)}, CUDA graphs, {default}; the sweep's "
            f"fastest over its batch sizes: '{best}'; peak = {f(d['config'].get('peak_tb_s', 4.3))} TB/s "
            f"(benchmark/hbm_ceiling.py); read ceiling = a batch-1 BF16 linear "
            f"over 1 GiB, {f(ceiling)} TB/s in the same run. (source: {source(d)})\n\n" + table(header, rows))


def render(results: dict[tuple[str, str, str], dict]) -> str:
    parts = []
    for (kind, cfg, gpu), d in sorted(results.items()):
        if kind == "bench_one_batch":
            if not d.get("mtp_token_map_size"):  # a draft vocabulary changes MTP only: its decode rows are the plain table's
                parts.append(decode_table(d))
            if d.get("mtp"):
                parts.append(mtp_table(d))
            # Adaptive runs from before plain decode (k = 0) was timed beside them fed the chooser
            # the slice's own costs (d10a9ef) and have no like-for-like base: not shown.
            adaptive = [m for m in d.get("mtp_adaptive") or [] if any(r["k"] == 0 for r in m["runs"])]
            if adaptive:
                parts.append(adaptive_table({**d, "mtp_adaptive": adaptive}))
        elif kind == "bench_peer":
            parts.append(peer_table(results.get(("bench_one_batch", cfg, gpu)), d))
        elif kind == "bench_moe_nvfp4":
            parts.append(moe_table(d))
        else:
            parts.append(serving_table(d))
    return "\n\n".join(parts) + "\n"


def update_readme(readme: Path, text: str) -> None:
    s = readme.read_text()
    if START not in s or END not in s:
        sys.exit(f"{readme}: add the lines {START} and {END} where the tables go")
    head, rest = s.split(START, 1)
    readme.write_text(head + START + "\n" + text + rest[rest.index(END):])


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", type=Path, default=[ROOT / "benchmark" / "results"])
    p.add_argument("--include-cpu", action="store_true", help="also results measured without a GPU")
    p.add_argument("--readme", type=Path, default=None)
    args = p.parse_args(argv)
    text = render(load(args.paths, args.include_cpu))
    if args.readme:
        update_readme(args.readme, text)
    print(text)
    return text


if __name__ == "__main__":
    main()
