"""Issue 18 item 2: a request the scheduler cannot run costs only that request, and a failing model
step fails the requests of that step with a 5xx (SSE: error event + [DONE]) and makes the server
report itself unhealthy; every pool slot comes back either way.

The model-step failure is injected through the test-only hook of model_executor/step_faults.py:
every forward raises while a file exists."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from .bystander import Bystander, body
from .server import ServerProcess

BAD_BIAS = {"temperature": 0, "max_new_tokens": 4, "logit_bias": {"999999": 5.0}}
CHAT = {"model": "inkling-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def post(server, path, payload, **kw):
    return requests.post(server.base_url + path, json=payload, headers=server.headers, timeout=120, **kw)


def test_logit_bias_beyond_the_vocabulary_fails_only_its_request(server):
    with Bystander(server), ThreadPoolExecutor(6) as pool:
        native = [pool.submit(post, server, "/generate", {"text": "hi", "sampling_params": BAD_BIAS})
                  for _ in range(4)]  # fmt: skip
        chat = pool.submit(post, server, "/v1/chat/completions", {**CHAT, "logit_bias": {"999999": 5}})
        for f in native + [chat]:
            r = f.result()
            assert r.status_code == 400, r.text
            assert "999999" in r.text
    server.wait_idle_baseline()


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """Four request slots (issue 18: four bad requests used to leak them all) and the fault hook."""
    switch = tmp_path_factory.mktemp("fault") / "fail-now"
    s = ServerProcess("--skip-server-warmup", "--max-running-requests", "4",
                      env={"SGL_INKLING_TEST_FAIL_FORWARD": f"@{switch}"})  # fmt: skip
    s.switch = switch
    yield s
    s.stop()


def test_bad_requests_never_use_up_the_slots(faulty):
    with Bystander(faulty):
        for _ in range(3):  # more bad requests than slots, each refused on its own
            r = post(faulty, "/generate", {"input_ids": [1, 2, 3], "sampling_params": BAD_BIAS})
            assert r.status_code == 400, r.text
    assert faulty.generate(text="still serving", sampling_params={"max_new_tokens": 2})["output_ids"]
    faulty.wait_idle_baseline()


def _stream_events(server, out: dict) -> None:
    payload = {**body(seed=21, n=3000), "stream": True}
    with post(server, "/generate", payload, stream=True) as r:
        out["status"] = r.status_code
        out["events"] = [line[6:] for line in r.iter_lines() if line.startswith(b"data: ")]


def _wait_running(server, n: int) -> None:
    deadline = time.time() + 30
    while server.internal_state()["num_running_reqs"] < n:
        assert time.time() < deadline, "requests never started"
        time.sleep(0.02)


def test_model_step_failure_reaches_every_client_and_health(faulty):
    stream, blocking = {}, {}
    threads = [threading.Thread(target=_stream_events, args=(faulty, stream)),
               threading.Thread(target=lambda: blocking.update(r=post(faulty, "/generate", body(22, 3000))))]
    for t in threads:
        t.start()
    _wait_running(faulty, 2)
    faulty.switch.touch()  # from now on every forward raises
    try:
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a request hangs after the model step failed"
        r = blocking["r"]
        assert r.status_code == 500 and "injected model-step failure" in r.json()["message"], r.text
        assert stream["status"] == 200
        events = stream["events"]
        assert events[-1] == b"[DONE]", events[-3:]
        err = json.loads(events[-2])["error"]
        assert err["code"] == 500 and "injected" in err["message"]
        assert all("text" in json.loads(e) for e in events[:-2])  # tokens streamed before the failure
        chat = post(faulty, "/v1/chat/completions", CHAT)
        assert chat.status_code == 500 and "injected" in chat.json()["message"], chat.text
        assert faulty.get("/health").status_code == 503
        assert faulty.get("/health_generate").status_code == 503  # its own probe fails too
    finally:
        faulty.switch.unlink()
    assert faulty.get("/health").status_code == 503  # until a probe shows generation works again
    assert faulty.get("/health_generate").status_code == 200
    assert faulty.get("/health").status_code == 200
    faulty.wait_idle_baseline()


def test_transient_model_step_failure_is_reported_once(faulty):
    faulty.switch.touch()
    try:
        r = post(faulty, "/generate", {"text": "fail", "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 500, r.text
    finally:
        faulty.switch.unlink()
    assert faulty.get("/health").status_code == 503
    assert faulty.get("/health_generate").status_code == 503  # the probe reports the failure it missed
    assert faulty.get("/health_generate").status_code == 200
    assert faulty.get("/health").status_code == 200
    with Bystander(faulty):
        pass
    faulty.wait_idle_baseline()
