"""Aborts of every kind free every pool slot: mid-stream disconnect, client timeout, /abort_request."""

from __future__ import annotations

import threading
import time

import requests

from test.unit.helpers import random_prompt

LONG = {"temperature": 0, "max_new_tokens": 3000, "ignore_eos": True}


def test_disconnect_mid_stream_frees_the_pools(server):
    body = {"input_ids": random_prompt(20, seed=1), "sampling_params": LONG, "stream": True}
    with requests.post(server.base_url + "/generate", json=body, stream=True, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith(b"data: ") for line in got)
    # The connection is closed: the server must notice, abort and free everything.
    server.wait_idle_baseline(timeout=30)


def test_client_timeout_on_a_blocking_request_frees_the_pools(server):
    body = {"input_ids": random_prompt(20, seed=2), "sampling_params": LONG}
    try:
        requests.post(server.base_url + "/generate", json=body, timeout=1.5)
    except requests.Timeout:
        pass
    server.wait_idle_baseline(timeout=30)


def test_abort_request_endpoint_finishes_the_request_with_abort(server):
    result = {}

    def run():
        result["out"] = server.generate(
            input_ids=random_prompt(20, seed=3), sampling_params=LONG, rid="victim-1"
        )

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 30
    while server.internal_state()["num_running_reqs"] == 0 and time.time() < deadline:
        time.sleep(0.05)
    assert server.post("/abort_request", {"rid": "victim-1"}).status_code == 200
    t.join(timeout=60)
    meta = result["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 3000
    server.wait_idle_baseline()
