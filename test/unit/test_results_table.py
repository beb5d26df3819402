"""benchmark/results_table.py on hand-written result files: merging per batch size, the ratios to the
port, the serving rows and the README block."""

from __future__ import annotations

import json

import pytest

from benchmark import results_table


def one_batch(bs: int, step: float, graph: float | None, ts: str) -> dict:
    layer = {"layer": 0, "kind": "sliding", "ms": 1.0, "floor_ms": 0.5, "achieved_fraction": 0.5}
    run = {"mode": "kernels", "batch_size": bs, "prefill_ms": 10.0, "decode_step_ms": step, "cuda_graph_step_ms": graph,
           "decode_step_floor_ms": 1.0, "layers": [layer],
           "extrapolated_66_layers": {"tok_per_s_per_user": 1.0, "cuda_graph_tok_per_s_per_user": None,
                                      "floor_tok_per_s_per_user": 2.0}}  # fmt: skip
    return {"benchmark": "bench_one_batch", "config": "inkling-slice", "gpu": "H200", "timestamp": ts,
            "git_commit": "abc", "runs": [run]}  # fmt: skip


@pytest.fixture
def results(tmp_path):
    files = {
        "a.json": one_batch(1, 8.0, 2.0, "2026-01-01T00:00:00"),
        "b.json": one_batch(64, 20.0, 16.0, "2026-01-02T00:00:00"),
        "old.json": one_batch(64, 99.0, None, "2025-01-01T00:00:00"),  # superseded by b.json
        "peer.json": {"benchmark": "bench_peer", "config": "inkling-slice", "gpu": "H200", "timestamp": "t",
                      "out_of_memory_batch_sizes": {"64": [64]},
                      "runs": [{"batch_size": 1, "decode_step_ms": 110.0, "output_tok_per_s": 1e3 / 110},
                               {"batch_size": 32, "decode_step_ms": 400.0, "output_tok_per_s": 32e3 / 400}]},
        "cpu.json": {**one_batch(1, 3.21, None, "2027-01-01T00:00:00"), "gpu": None},  # not a GPU figure
        "other.json": {"benchmark": "bench_grammar", "runs": [1]},
    }  # fmt: skip
    for name, d in files.items():
        (tmp_path / name).write_text(json.dumps(d))
    return tmp_path


def test_tables_merge_batch_sizes_and_compare_with_the_port(results):
    text = results_table.main([str(results)])
    decode = [line for line in text.splitlines() if line.startswith("| kernels")]
    assert [line.split("|")[2].strip() for line in decode] == ["1", "64"]
    assert "99.000" not in text and "3.210" not in text  # the older bs64 file and the CPU file are left out
    peer_rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| 1 ") or
                 line.startswith("| 32 ")}  # fmt: skip
    assert "55.0x" in peer_rows["1"]  # 110 ms (port) / 2 ms (our CUDA graph) at batch 1
    # Port batch 32 vs our batch 64: output tok/s 64 / 16 ms = 4000 vs 32 / 400 ms = 80, i.e. 50x.
    assert "| 64 |" in peer_rows["32"] and "50.0x" in peer_rows["32"]
    assert "out of memory at batch [64]" in text


def test_serving_table_and_readme_block(results, tmp_path):
    run = {"max_concurrency": 8, "completed": 16, "num_prompts": 16, "output_throughput": 1234.5,
           "request_throughput": 2.0, "mean_ttft_ms": 50.0, "p99_ttft_ms": 90.0, "mean_tpot_ms": 7.0,
           "p99_tpot_ms": 9.0, "median_itl_ms": 6.5, "p99_itl_ms": 12.0}  # fmt: skip
    serving = {"benchmark": "bench_serving", "gpu": "H200", "timestamp": "t", "random_input_len": 1024,
               "random_output_len": 256, "note": "scaled down", "server_args": {"served_model_name": "inkling-slice"},
               "runs": [run]}  # fmt: skip
    (results / "serving.json").write_text(json.dumps(serving))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{results_table.START}\nstale\n{results_table.END}\nrest\n")
    text = results_table.main([str(results), "--readme", str(readme)])
    assert "| 8 | 16/16 | 1234.5 | 2.00 | 50.0 | 90.0 | 7.00 | 9.00 | 6.50 | 12.00 |" in text
    assert "1024-token prompts, 256-token outputs" in text and "scaled down" in text
    body = readme.read_text()
    assert body.startswith("intro\n") and body.endswith(f"{results_table.END}\nrest\n") and "stale" not in body
    assert text in body


def test_mtp_table_takes_each_batch_size_from_its_file(results):
    def mtp(bs: int, tps: float) -> dict:
        run = {"forced_accept_length": 4.5, "verify_floor_ms": 4.0, "draft_chain_floor_ms": 7.0,
               "draft_chain_cuda_graph": {"ms": 10.0, "error": None},
               "extrapolated_66_layers": {"tok_per_s_per_user": 1.0, "cuda_graph_tok_per_s_per_user": tps}}  # fmt: skip
        return {"batch_size": bs, "verify_cuda_graph": {"ms": 5.5, "error": None}, "runs": [run]}

    for name, bs, tps, ts in (("m1.json", 1, 36.0, "2026-02-01T00:00:00"), ("m64.json", 64, 7.0, "2026-02-02T00:00:00")):
        d = one_batch(bs, 5.0, 2.0 if bs == 1 else 16.0, ts)
        d["runs"][0]["extrapolated_66_layers"]["cuda_graph_tok_per_s_per_user"] = 30.0 if bs == 1 else 2.8
        (results / name).write_text(json.dumps({**d, "mtp": [mtp(bs, tps)]}))
    text = results_table.main([str(results)])
    rows = [line for line in text.splitlines() if "| 4.5 |" in line]
    assert [line.split("|")[1].strip() for line in rows] == ["1", "64"]
    assert "| 36.0 | 30.0 | 1.20x |" in rows[0]  # 36 / 30 tok/s/user
    assert "| 7.0 | 2.8 | 2.50x |" in rows[1]
    assert "benchmark-only" in text


def test_plain_decode_at_66_layers_scales_the_graph_timed_layers(results):
    """Plain decode's 66-layer figure: the trunk at its CUDA-graph time per layer (55 sliding + 11 full,
    the eager per-kind mix scaled by the slice's graph/eager layer ratio) plus the graph step outside
    the layers; not the eager step scaled by the graph/eager step ratio, which charges each layer its
    launch gaps (what the stored cuda_graph_tok_per_s_per_user of older files holds)."""
    d = one_batch(1, 5.0, 2.0, "2026-03-01T00:00:00")
    run = d["runs"][0]
    run["layers"] = [{"layer": 0, "kind": "sliding", "ms": 1.0, "floor_ms": 0.1, "achieved_fraction": 0.1},
                     {"layer": 1, "kind": "full", "ms": 3.0, "floor_ms": 0.1, "achieved_fraction": 0.1}]  # fmt: skip
    run["cuda_graph_step_ms"], run["cuda_graph_layers_ms_per_layer"] = 1.5, 0.5  # layers: 1.0 of 4.0 eager
    run["extrapolated_66_layers"]["cuda_graph_tok_per_s_per_user"] = 1.0  # the old formula's: not shown
    (results / "d.json").write_text(json.dumps(d))
    text = results_table.main([str(results)])
    step66 = (55 * 1.0 + 11 * 3.0) * (1.0 / 4.0) + (1.5 - 1.0)  # 22.5 ms
    row = next(line for line in text.splitlines() if line.startswith("| kernels | 1 |"))
    assert f"| {1e3 / step66:.1f} |" in row


def test_serving_with_and_without_mixed_chunk_are_two_tables_with_back_to_back(tmp_path):
    def serving(mixed: bool, tok_s: float) -> dict:
        run = {"max_concurrency": 64, "completed": 64, "num_prompts": 64, "output_throughput": tok_s,
               "request_throughput": 1.0, "mean_ttft_ms": 1.0, "p99_ttft_ms": 2.0, "mean_tpot_ms": 3.0,
               "p99_tpot_ms": 4.0, "median_itl_ms": 5.0, "p99_itl_ms": 6.0,
               "back_to_back": {"output_throughput": 2060.0}, "output_throughput_over_back_to_back": tok_s / 2060,
               "p99_ttft_over_prefill_all": 0.5}  # fmt: skip
        return {"benchmark": "bench_serving", "gpu": "H200", "timestamp": f"t{mixed}", "git_commit": "abc",
                "server_args": {"served_model_name": "inkling-slice"}, "enable_mixed_chunk": mixed,
                "random_input_len": 8192, "random_output_len": 1024, "runs": [run]}  # fmt: skip

    for mixed, tok_s in ((True, 2100.0), (False, 1290.0)):
        (tmp_path / f"{mixed}.json").write_text(json.dumps(serving(mixed, tok_s)))
    # A newer MTP run of the same served model without mixed chunks: a table of its own, not the plain one.
    mtp = serving(False, 71.8) | {"timestamp": "tz"}
    mtp["server_args"] = {"served_model_name": "inkling-slice", "speculative_algorithm": "MTP"}
    (tmp_path / "mtp.json").write_text(json.dumps(mtp))
    text = results_table.render(results_table.load([tmp_path], include_cpu=False))
    on, off = text.split("mixed chunk on")[1], text.split("inkling-slice, mixed chunk off")[1].split("mixed chunk")[0]
    assert "back-to-back tok/s" in text
    assert "| 2100.0 |" in on and "| 2060.0 | 1.02 | 0.50 |" in on
    assert "| 1290.0 |" in off and "| 2060.0 | 0.63 | 0.50 |" in off
    assert "| 71.8 |" in text.split("inkling-slice, MTP fixed, mixed chunk off")[1].split("mixed chunk")[0]


def _moe_doc(default_build: dict, variants: list[tuple[dict, float]]) -> dict:
    """A bench_moe_nvfp4 file of one batch size: the default dispatch at 1.0 ms beside CUDA variants."""
    def row(tiles, ms):
        return {"tiles": tiles, "ms": ms, "tb_s": 0.4 / ms, "fraction_of_peak": 0.4 / ms / 4.3,
                "routed_only_tb_s": 0.2 / ms, "sinks_only_tb_s": 0.2 / ms}
    return {"benchmark": "bench_moe_nvfp4", "gpu": "H200", "git_commit": "abc", "timestamp": "t",
            "config": {"hidden": 8, "inter": 4, "experts": 2, "top_k": 1, "sinks": 1}, "bf16_linear_read_tb_s": 4.0,
            "default_build": default_build,
            "results": [{"batch_size": 1, "distinct_experts_per_call": 1.0, "bytes_routed_plus_sinks": 4e8,
                         "variants": [row({"path": "default dispatch"}, 1.0)] + [row(t, ms) for t, ms in variants]}]}


def test_moe_table_shows_the_shipped_build_where_the_run_timed_it_as_a_variant():
    from benchmark.moe_build import parse
    from benchmark.results_table import moe_table

    shipped = {"path": "cuda", **vars(parse(""))}
    older = {**shipped, "warps": 4, "row_ring": 4, "lean": 0}  # a run whose default was another build
    other = {**shipped, "row_ring": 0}
    got = moe_table(_moe_doc(older, [(other, 0.9), (shipped, 0.5)]))
    assert "| 1 | 1.0 | 400 | 500.0 |" in got and "the shipped build" in got
    # the run's default is the shipped build: its default dispatch row
    got = moe_table(_moe_doc({k: v for k, v in shipped.items() if k != "path"}, [(other, 0.9)]))
    assert "| 1 | 1.0 | 400 | 1000.0 |" in got and "the shipped build" not in got
    # an older default, but the shipped build was not among the variants: the default dispatch row
    got = moe_table(_moe_doc(older, [(other, 0.9)]))
    assert "| 1 | 1.0 | 400 | 1000.0 |" in got


def test_runs_on_two_cards_are_two_tables_each_with_its_ceiling(tmp_path):
    """An H100 run never fills batch sizes into (or replaces) the H200's table of one config: each card
    has its table, its floors quoted at the ceiling that run used (benchmark/hbm_ceiling.py)."""
    h200 = one_batch(1, 8.0, 2.0, "2026-01-01T00:00:00") | {"bandwidth_bytes_per_s": 4.3e12}
    h100 = one_batch(64, 20.0, 16.0, "2026-01-02T00:00:00") | {"gpu": "H100", "bandwidth_bytes_per_s": 3.0e12}
    for name, d in (("h200.json", h200), ("h100.json", h100)):
        (tmp_path / name).write_text(json.dumps(d))
    tables = results_table.render(results_table.load([tmp_path], include_cpu=False)).split("Decode latency")[1:]
    assert len(tables) == 2
    by_card = {("H100" if "H100, commit" in t else "H200"): t for t in tables}
    assert "floors at 3.00 TB/s" in by_card["H100"] and "| kernels | 64 |" in by_card["H100"]
    assert "| kernels | 1 |" not in by_card["H100"]
    assert "floors at 4.30 TB/s" in by_card["H200"] and "| kernels | 64 |" not in by_card["H200"]


def test_a_draft_vocabulary_run_is_a_table_of_its_own_without_decode_rows(tmp_path):
    """bench_one_batch --mtp-token-map-size: its MTP figures never replace the full-vocabulary run's of
    the same config and card (a newer file would, by batch size), and its plain decode rows, the same
    measurement as the plain table's, are not shown twice."""
    full = one_batch(1, 8.0, 2.0, "2026-01-01T00:00:00") | {"mtp": [{"batch_size": 1, "runs": []}]}
    mapped = one_batch(1, 7.0, 2.5, "2026-01-02T00:00:00") | {"mtp_token_map_size": 32768}
    for name, d in (("full.json", full), ("mapped.json", mapped)):
        (tmp_path / name).write_text(json.dumps(d))
    results = results_table.load([tmp_path], include_cpu=False)
    configs = {cfg for _, cfg, _ in results}
    assert configs == {"inkling-slice", "inkling-slice, 32768-token draft vocabulary"}
    assert results[("bench_one_batch", "inkling-slice", "H200")]["mtp"] == full["mtp"]
    text = results_table.render({k: v for k, v in results.items() if "draft vocabulary" in k[1]})
    assert "Decode latency" not in text
