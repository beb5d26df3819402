"""Upstream's serving flags against a real server: /metrics (--enable-metrics) parsed with
prometheus_client and checked against the requests made; --stream-interval,
--incremental-streaming-output, --enable-cache-report, --log-requests and --watchdog-timeout each
visibly in effect."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from test.unit.helpers import random_prompt

from .server import ServerProcess, free_port

FLAGS = ("--skip-server-warmup", "--enable-metrics", "--enable-cache-report", "--log-requests",
         "--stream-interval", "4", "--incremental-streaming-output")  # fmt: skip


@pytest.fixture(scope="module")
def observed(tiny_path):
    s = ServerProcess(*FLAGS)
    os.set_blocking(s.proc.stdout.fileno(), False)
    yield s
    s.stop()


def scrape(server) -> dict:
    r = server.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(families: dict, family: str, sample: str | None = None, **labels) -> float:
    """Sum of the samples named `sample` (default: the family's own name) whose labels include these."""
    f = families[family]
    name = sample or f.name
    return sum(s.value for s in f.samples if s.name == name and labels.items() <= s.labels.items())


def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def test_metrics_count_the_requests_made(observed):
    before = scrape(observed)
    shapes = [(10, 5), (23, 9), (7, 1)]
    outs = [observed.generate(input_ids=random_prompt(n, seed=40 + i), sampling_params=greedy(m))
            for i, (n, m) in enumerate(shapes)]  # fmt: skip
    turn2 = random_prompt(23, seed=41) + outs[1]["output_ids"] + random_prompt(3, seed=60)  # a cache hit
    outs.append(observed.generate(input_ids=turn2, sampling_params=greedy(2)))
    after = scrape(observed)
    metas = [o["meta_info"] for o in outs]
    unfed = 0 if observed.internal_state()["overlap_schedule"] else 1  # overlapped, the step after the end fed it
    assert [m["completion_tokens"] for m in metas] == [5, 9, 1, 2] and metas[-1]["cached_tokens"] == 23 + 9 - unfed

    def delta(family, sample=None, **labels):
        return value(after, family, sample, **labels) - value(before, family, sample, **labels)

    name = {"model_name": "inkling-tiny"}
    assert delta("sglang:num_requests", "sglang:num_requests_total", **name, is_streaming="false") == 4
    assert delta("sglang:prompt_tokens", "sglang:prompt_tokens_total", **name) == 10 + 23 + 7 + 35
    assert delta("sglang:generation_tokens", "sglang:generation_tokens_total", **name) == 5 + 9 + 1 + 2
    assert delta("sglang:cached_tokens", "sglang:cached_tokens_total", **name) == sum(m["cached_tokens"] for m in metas)
    for hist in ("sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
                 "sglang:queue_time_seconds"):  # fmt: skip
        assert after[hist].type == "histogram"
        assert delta(hist, hist + "_count", **name) == 4, hist
    # One inter-token gap per token after the first.
    assert delta("sglang:inter_token_latency_seconds", "sglang:inter_token_latency_seconds_count") == 4 + 8 + 0 + 1
    e2e = delta("sglang:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds_sum")
    assert e2e == pytest.approx(sum(m["e2e_latency"] for m in metas), rel=0.05)
    # +Inf bucket holds every observation.
    assert delta("sglang:time_to_first_token_seconds", "sglang:time_to_first_token_seconds_bucket", le="+Inf") == 4

    state = observed.internal_state()
    assert after["sglang:num_running_reqs"].type == "gauge"
    assert value(after, "sglang:num_running_reqs", **name) == 0
    assert value(after, "sglang:max_total_num_tokens", **name) == state["full_kv_total"]
    assert value(after, "sglang:kv_evictable_tokens", **name) == state["radix_cached_tokens"]
    hit = value(after, "sglang:cached_tokens", "sglang:cached_tokens_total") / value(
        after, "sglang:prompt_tokens", "sglang:prompt_tokens_total"
    )
    assert value(after, "sglang:cache_hit_rate", **name) == pytest.approx(hit)
    assert value(after, "sglang:gen_throughput", **name) > 0


def test_metrics_404_without_the_flag(server):
    assert server.get("/metrics").status_code == 404


def test_an_idle_keep_alive_connection_outlives_the_clients_expiry(server):
    # httpx (and so the OpenAI client) keeps an idle pooled connection for 5 s; a server that closed
    # its side at the same moment failed requests sent on it ("Server disconnected without sending a
    # response", seen in test_grammar.py). The same socket must still serve after 6 s idle.
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    socks = []
    try:
        for pause in (0.0, 6.0):
            time.sleep(pause)
            conn.request("GET", "/health")
            r = conn.getresponse()
            r.read()
            assert r.status == 200
            socks.append(conn.sock)
        assert socks[0] is socks[1]  # not reconnected: the server kept the connection open
    finally:
        conn.close()


def sse_chunks(base_url: str, body: dict) -> list[dict]:
    r = requests.post(base_url + "/generate", json={**body, "stream": True}, stream=True, timeout=120)
    return [json.loads(line[6:]) for line in (b.decode() for b in r.iter_lines())
            if line and line != "data: [DONE]"]  # fmt: skip


def test_stream_interval_groups_tokens(observed):
    chunks = sse_chunks(observed.base_url, {"input_ids": random_prompt(9, seed=50), "sampling_params": greedy(13)})
    # --stream-interval 4: the first token at once, then every 4 tokens (the default server sends 13
    # chunks); --incremental-streaming-output: each chunk only its new tokens.
    assert [len(c["output_ids"]) for c in chunks] == [1, 4, 4, 4]


@pytest.mark.parametrize("with_stop", [False, True])
def test_incremental_chunks_add_up_to_the_default_servers_answer(observed, server, with_stop):
    """The deltas, concatenated, are the whole answer the default server gives (text, ids, logprobs
    and top logprobs; input logprobs in the first chunk only), with a stop string held back too."""
    body = {"input_ids": random_prompt(11, seed=51), "sampling_params": greedy(15), "return_logprob": True,
            "top_logprobs_num": 2, "logprob_start_len": 3, "return_text_in_logprobs": True}  # fmt: skip
    if with_stop:  # two characters from the middle of the free answer: it stops part-way
        text = server.generate(**body)["text"]
        body["sampling_params"] = {**body["sampling_params"], "stop": text[len(text) // 2 : len(text) // 2 + 2]}
    whole = server.generate(**body)
    assert whole["meta_info"]["finish_reason"]["type"] == ("stop" if with_stop else "length")
    chunks = sse_chunks(observed.base_url, body)
    assert len(chunks) >= 2
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]
    for key in ("output_token_logprobs", "output_top_logprobs"):
        got = [x for c in chunks for x in c["meta_info"][key]]
        assert json.loads(json.dumps(got)) == json.loads(json.dumps(whole["meta_info"][key])), key
    assert chunks[0]["meta_info"]["input_token_logprobs"] == whole["meta_info"]["input_token_logprobs"]
    assert all(c["meta_info"]["input_token_logprobs"] == [] for c in chunks[1:])
    assert chunks[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert chunks[-1]["meta_info"]["completion_tokens"] == len(whole["output_ids"])


def test_cache_report_in_openai_usage(observed, server):
    client = openai.OpenAI(base_url=observed.base_url + "/v1", api_key="none", max_retries=0)
    fresh = client.completions.create(model="inkling-tiny", prompt=random_prompt(12, seed=70), max_tokens=2)
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    turn1 = random_prompt(20, seed=71)
    out = observed.generate(input_ids=turn1, sampling_params=greedy(3))["output_ids"]
    turn2 = turn1 + out + random_prompt(4, seed=72)  # continues the cached conversation
    again = client.completions.create(model="inkling-tiny", prompt=turn2, max_tokens=2, temperature=0)
    unfed = 0 if observed.internal_state()["overlap_schedule"] else 1  # overlapped, the step after the end fed it
    assert again.usage.prompt_tokens_details.cached_tokens == 20 + 3 - unfed
    plain = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    usage = plain.completions.create(model="inkling-tiny", prompt=turn2, max_tokens=2).usage
    assert usage.prompt_tokens_details is None  # no --enable-cache-report


def _read_log(server, needle: str, timeout: float = 10.0) -> str:
    seen, deadline = "", time.time() + timeout
    while needle not in seen and time.time() < deadline:
        ready, _, _ = select.select([server.proc.stdout], [], [], 0.2)
        if ready:
            seen += server.proc.stdout.read() or ""
    return seen


def test_log_requests_logs_receive_and_finish(observed):
    observed.generate(text="log this request", rid="logged-rid", sampling_params=greedy(3))
    log = _read_log(observed, "Finish: rid=logged-rid")
    assert "Receive: rid=logged-rid" in log and "input=log this request" in log  # level 2: the input
    line = next(x for x in log.splitlines() if "Finish: rid=logged-rid" in x)
    assert "completion_tokens=3" in line and "output=" in line


def test_watchdog_timeout_kills_a_hung_server(tiny_path):
    # Any forward takes longer than a millisecond, so the first step "hangs" and the server must go.
    port = free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(port), "--log-level", "warning",
           "--skip-server-warmup", "--watchdog-timeout", "0.001"]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=5).ok:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        with pytest.raises(requests.RequestException):  # the connection dies with the server
            requests.post(f"http://127.0.0.1:{port}/generate", json={"text": "hi"}, timeout=60)
        assert proc.wait(timeout=30) != 0
        assert "over --watchdog-timeout" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_scheduler_freezes_its_start_up_objects_out_of_garbage_collection(server):
    """A full collection in the scheduler walked its ~356K start-up objects (235-320 ms on a CPU,
    a pause the GPU waits for every few dozen steps); frozen after start-up, serving's collections
    skip them. The model, torch and the imports alone are far more than 50K objects."""
    assert server.internal_state()["gc_frozen_objects"] > 50_000


def test_gc_warning_threshold_logs_long_collections_only(caplog):
    import gc
    import logging

    from sgl_inkling.entrypoints.gc_control import warn_long_collections
    from sgl_inkling.server_args import ServerArgsError, parse_server_args

    before = list(gc.callbacks)
    try:
        warn_long_collections(0, "test")  # off: nothing installed
        assert gc.callbacks == before
        with caplog.at_level(logging.WARNING, logger="sgl_inkling.entrypoints.gc_control"):
            warn_long_collections(3600, "slow")
            gc.collect()
            assert not caplog.records  # no collection takes an hour
            warn_long_collections(1e-9, "fast")
            gc.collect()
        assert any("fast: garbage collection of generation 2" in r.getMessage() for r in caplog.records)
    finally:
        gc.callbacks[:] = before
    assert parse_server_args(["--model-path", "x", "--gc-warning-threshold-secs", "0.05"]).gc_warning_threshold_secs == 0.05
    with pytest.raises((ServerArgsError, SystemExit)):
        parse_server_args(["--model-path", "x", "--gc-warning-threshold-secs", "-1"]).check()
