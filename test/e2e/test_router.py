"""sglang-router (the Rust router package) in front of two inkling-tiny servers.

The router discovers each worker through /health, /server_info (or /get_server_info), /model_info
(or /get_model_info) and polls /get_load; it re-serialises /generate bodies with SGLang fields of its
own. Requests from the official OpenAI client through the router must give exactly what a server gives
directly, and round robin must spread them over both servers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from .server import ServerProcess, free_port

MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def second_server(tiny_path):
    s = ServerProcess("--skip-server-warmup")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def router(server, second_server):
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", server.base_url,
           second_server.base_url, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
           "--worker-startup-check-interval", "1", "--log-level", "warn",
           "--prometheus-port", str(free_port())]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    try:
        while True:
            assert proc.poll() is None, f"router exited:\n{proc.stdout.read()}"
            try:
                ready = requests.get(url + "/readiness", timeout=5)
                if ready.ok and ready.json().get("healthy_workers") == 2:
                    break
            except requests.RequestException:
                pass
            assert time.time() < deadline, "the router did not register both workers"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _finished(s: ServerProcess) -> int:
    return s.internal_state()["num_finished_reqs"]


def test_openai_client_through_the_router(server, second_server, router):
    before = [_finished(server), _finished(second_server)]
    via = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0)
    direct = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    kw = {"model": "inkling-tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    want = direct.chat.completions.create(**kw)
    for _ in range(4):
        got = via.chat.completions.create(**kw)
        assert got.choices[0].message.content == want.choices[0].message.content
        assert got.usage.completion_tokens == want.usage.completion_tokens
    streamed = "".join(
        c.choices[0].delta.content or "" for c in via.chat.completions.create(**kw, stream=True) if c.choices
    )
    assert streamed == (want.choices[0].message.content or "")
    ckw = {"model": "inkling-tiny", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    assert via.completions.create(**ckw).choices[0].text == direct.completions.create(**ckw).choices[0].text
    assert [m.id for m in via.models.list().data] == ["inkling-tiny"]
    after = [_finished(server), _finished(second_server)]
    served = [a - b for a, b in zip(after, before)]
    assert all(n >= 2 for n in served), f"round robin left a server idle: {served}"
    assert sum(served) == 1 + 4 + 1 + 2  # the direct reference requests ran on `server`


def test_native_generate_through_the_router(server, router):
    """The router adds model, log_metrics, return_hidden_states=false, ... to /generate bodies."""
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    want = server.generate(**body)
    for _ in range(2):  # once on each server
        r = requests.post(router + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == want["output_ids"]
    bad = server.post("/generate", {**body, "return_hidden_states": True})
    assert bad.status_code == 400 and "return_hidden_states" in bad.json()["message"]


def test_router_admin_endpoints_reach_the_servers(server, second_server, router):
    loads = requests.get(router + "/get_loads", timeout=30).json()["workers"]
    assert sorted(w["worker"] for w in loads) == sorted([server.base_url, second_server.base_url])
    assert all(w["load"] >= 0 for w in loads), f"the router could not read /get_load: {loads}"
    assert requests.post(router + "/flush_cache", timeout=30).ok
    for s in (server, second_server):
        assert s.internal_state().get("radix_cached_tokens", 0) == 0  # the router's flush reached it
        s.wait_idle_baseline()


def test_router_loads_the_tokenizer_and_serves_mixed_requests(server, second_server, router):
    """The router registers the worker's tokenizer (from the files /get_model_info points at) and
    tokenizes as the runtime does; then 20 mixed requests through it all succeed."""
    from sgl_inkling.chat.tokenizer import get_tokenizer

    deadline = time.time() + 60
    while not requests.get(router + "/v1/tokenizers", timeout=10).json()["tokenizers"]:
        assert time.time() < deadline, "the router registered no tokenizer"
        time.sleep(0.5)
    text = "Hello world, again: naïve café 東京 1234"
    r = requests.post(router + "/v1/tokenize", json={"model": "inkling-tiny", "prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == get_tokenizer().encode(text)

    chat = {"model": "inkling-tiny", "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    kinds = [
        ("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}),
        ("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 5}, "stream": True}),
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, "stream": True}),
        ("/v1/completions", {"model": "inkling-tiny", "prompt": "Once", "max_tokens": 5}),
    ]

    def send(i: int) -> int:
        path, body = kinds[i % len(kinds)]
        resp = requests.post(router + path, json=body, timeout=120, stream=body.get("stream", False))
        if body.get("stream"):
            events = [x for x in (x.decode() for x in resp.iter_lines()) if x.startswith("data: ")]
            assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:]), (path, events[-3:])
        else:
            assert resp.json(), path
        return resp.status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(send, range(20))) == [200] * 20
    for s in (server, second_server):
        s.wait_idle_baseline()
