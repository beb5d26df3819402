"""benchmark/bench_serving.py against the shared tiny server at tiny lengths: the JSON it writes must
account for every request and token, and its latencies must be mutually consistent."""

from __future__ import annotations

import json

import orjson
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
        "--seed", "7", "--note", "smoke", "--output-file", str(out), "--client-processes", "2",
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
        assert run["client_processes"] == min(c, 2)  # level 3: two forked clients share its threads
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
            # The server's own clock starts after the request arrived and stops before its last
            # event left: inside the client's.
            assert 0 < r["server_e2e"] < r["e2e"]
        assert run["median_client_minus_server_e2e_ms"] > 0
        assert run["output_throughput"] == run["total_output_tokens"] / run["duration_s"]
        for m in ("ttft", "tpot", "itl", "e2e_latency"):
            assert 0 < run[f"median_{m}_ms"] <= run[f"p99_{m}_ms"], m
        assert run["mean_ttft_ms"] <= run["mean_e2e_latency_ms"]
        # Every request has ITL gaps summing to E2E - TTFT, so TPOT (their per-token mean) <= E2E.
        assert run["mean_tpot_ms"] * (min(o for _, o in wanted) - 1) <= run["mean_e2e_latency_ms"]
        # The gaps by length: every gap in one bin (a chunk may carry more than one token), and the
        # bins' time adds up to every request's first-to-last token span. The stream's end ([DONE],
        # the connection closing) comes after the last token, so E2E is not part of that sum.
        gaps = sum(b["count"] for b in run["itl_bins"])
        assert 0 < gaps <= run["total_output_tokens"] - run["completed"]
        for r in reqs:
            assert r["ttft"] <= r["last_token"] <= r["e2e"]
        assert sum(b["total_s"] for b in run["itl_bins"]) == pytest.approx(
            sum(r["last_token"] - r["ttft"] for r in reqs), rel=1e-9)
        assert "cpu_us_per_output_token" not in run  # no launched server: no processes to read
    server.wait_idle_baseline()


def test_completion_tokens_is_read_without_parsing_as_a_full_parse_reads_it():
    """The client's scan for meta_info's completion_tokens against orjson on events whose text and
    logprob texts spell the key themselves (escaped, as JSON must)."""
    tricky = 'say "completion_tokens":7 and \\"completion_tokens\\":8'
    for n, text in [(1, "plain"), (123, tricky), (4096, tricky * 3)]:
        payload = {"text": text, "output_ids": list(range(n)), "meta_info": {
            "output_token_logprobs": [[-0.5, 3, '"completion_tokens":99']], "completion_tokens": n,
            "finish_reason": None}}  # fmt: skip
        event = b"data: " + orjson.dumps(payload)
        assert bench_serving._completion_tokens(event) == orjson.loads(event[5:])["meta_info"]["completion_tokens"] == n


def test_process_cpu_reads_the_launched_server_and_its_named_children():
    """bench_serving's CPU accounting walks the launched server's process tree by parent pid and
    names each child as it names itself (subprocess_utils.name_process, as the scheduler does)."""
    import os
    import shlex
    import signal
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from benchmark.bench_serving import process_cpu

    child = ("from sgl_inkling.managers.subprocess_utils import name_process; name_process('sgl-sched-tp0'); "
             "import time; time.sleep(30)")  # fmt: skip
    proc = subprocess.Popen(["sh", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(child)} & wait"],
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 20
        while "sgl-sched-tp0" not in (got := process_cpu(SimpleNamespace(proc=proc))) and time.time() < deadline:
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the shell and its child
        proc.wait()
    assert {"http (tokenizer manager)", "sgl-sched-tp0", "client (this process)"} <= set(got)
    assert all(v >= 0 for v in got.values()) and process_cpu(None) == {}


def test_slice_model_name_becomes_a_directory_with_its_config():
    args, name = resolve_bench_model(["--model-path", SLICE_NAME, "--tp", "1"])
    assert name == SLICE_NAME
    path = args[args.index("--model-path") + 1]
    assert InklingConfig.from_file(path).raw == slice_config().raw
    assert args[args.index("--load-format") + 1] == "dummy"  # the slice has no checkpoint
    assert resolve_bench_model(["--model", "/x", "--load-format", "safetensors"]) == (
        ["--model", "/x", "--load-format", "safetensors"], "/x")  # fmt: skip


@pytest.mark.parametrize("n", ["0", "-2"])
def test_client_processes_below_one_is_refused_naming_the_flag(n, capsys):
    with pytest.raises(SystemExit):
        bench_serving.parse_args(["--client-processes", n])
    assert "--client-processes" in capsys.readouterr().err
