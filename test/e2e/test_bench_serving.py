"""benchmark/bench_serving.py against the shared tiny server at tiny lengths: the JSON it writes must
account for every request and token, and its latencies must be mutually consistent."""

from __future__ import annotations

import json

import pytest

from benchmark import bench_serving
from benchmark.slice_dir import resolve_bench_model
from sgl_inkling.models.inkling.config import InklingConfig
from sgl_inkling.models.inkling.slice_config import SLICE_NAME, slice_config


def test_bench_serving_json_is_consistent(server, tmp_path):
    out = tmp_path / "serving.json"
    levels, n, in_len, out_len = [1, 3], 4, 24, 6
    engine = tmp_path / "engine.json"
    engine.write_text(json.dumps({"prefill_ms": 50.0, "input_len": in_len, "decode_step_ms": {"1": 5.0, "4": 8.0}}))
    bench_serving.main([
        "--engine-timings", str(engine),
        "--base-url", server.base_url, "--max-concurrency", *map(str, levels), "--num-prompts", str(n),
        "--random-input-len", str(in_len), "--random-output-len", str(out_len), "--random-range-ratio", "0.5",
        "--seed", "7", "--note", "smoke", "--output-file", str(out),
    ])  # fmt: skip
    d = json.loads(out.read_text())
    assert d["enable_mixed_chunk"] is False and d["engine_timings"]["prefill_ms"] == 50.0  # off by default
    for run, c in zip(d["runs"], levels):
        b = run["back_to_back"]  # n prefills of 50 ms, then waves of min(c, n) decoding 6 tokens
        steps = {1: [5.0] * 4, 3: [7.0, 5.0]}[c]  # batch 3: 7 ms between the measured 1 and 4
        assert b["wave_size"] == min(c, n) and b["duration_s"] == pytest.approx((n * 50 + 6 * sum(steps)) / 1e3)
        assert run["output_throughput_over_back_to_back"] == pytest.approx(
            run["output_throughput"] / b["output_throughput"])
        assert set(run["mixed_steps"]) == {"num_mixed_steps", "num_mixed_decode_tokens"}
    d = json.loads(out.read_text())
    assert d["benchmark"] == "bench_serving" and d["note"] == "smoke" and len(d["git_commit"]) >= 7
    assert d["server_args"]["served_model_name"] == "inkling-tiny"
    # The lengths the run asked for, drawn independently of the server's answers.
    wanted = sorted((len(ids), o) for ids, o in bench_serving.make_prompts(n, in_len, out_len, 0.5, 7))
    assert len({o for _, o in wanted}) > 1, "the range ratio should vary the output lengths"
    assert [r["max_concurrency"] for r in d["runs"]] == levels
    for run in d["runs"]:
        reqs = run["requests"]
        assert run["num_prompts"] == run["completed"] == n and run["failed"] == 0 and not run["errors"]
        assert sorted((r["prompt_len"], r["output_len"]) for r in reqs) == wanted  # exact token counts
        assert run["total_output_tokens"] == sum(o for _, o in wanted)
        assert run["total_input_tokens"] == sum(i for i, _ in wanted)
        for r in reqs:
            assert 0 < r["ttft"] <= r["e2e"] <= run["duration_s"]
        assert run["output_throughput"] == run["total_output_tokens"] / run["duration_s"]
        for m in ("ttft", "tpot", "itl", "e2e_latency"):
            assert 0 < run[f"median_{m}_ms"] <= run[f"p99_{m}_ms"], m
        assert run["mean_ttft_ms"] <= run["mean_e2e_latency_ms"]
        # Every request has ITL gaps summing to E2E - TTFT, so TPOT (their per-token mean) <= E2E.
        assert run["mean_tpot_ms"] * (min(o for _, o in wanted) - 1) <= run["mean_e2e_latency_ms"]
    server.wait_idle_baseline()


def test_slice_model_name_becomes_a_directory_with_its_config():
    args, name = resolve_bench_model(["--model-path", SLICE_NAME, "--tp", "1"])
    assert name == SLICE_NAME
    path = args[args.index("--model-path") + 1]
    assert InklingConfig.from_file(path).raw == slice_config().raw
    assert args[args.index("--load-format") + 1] == "dummy"  # the slice has no checkpoint
    assert resolve_bench_model(["--model", "/x", "--load-format", "safetensors"]) == (
        ["--model", "/x", "--load-format", "safetensors"], "/x")  # fmt: skip
