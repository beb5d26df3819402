"""Bad input gets a 4xx with a message, and the server keeps serving; never a 5xx."""

from __future__ import annotations

import pytest
import requests

from test.unit.helpers import random_prompt

from .server import ServerProcess

OK = {"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}


def raw_post(server, path: str, data: bytes, headers=None) -> requests.Response:
    h = {"Content-Type": "application/json", **server.headers, **(headers or {})}
    return requests.post(server.base_url + path, data=data, headers=h, timeout=60)


def assert_4xx(r: requests.Response, status: int | None = None) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    if status is not None:
        assert r.status_code == status, r.text
    body = r.json()
    message = body.get("message") or body.get("error", {}).get("message")
    assert isinstance(message, str) and message


CASES = {
    "malformed json": (b'{"text": "hi", ', None),
    "not an object": (b"[1, 2]", None),
    "invalid utf-8": (b'{"text": "\xff\xfe"}', None),
    "nan temperature": (b'{"text": "hi", "sampling_params": {"temperature": NaN}}', None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_raw_bodies(server, case):
    data, _ = CASES[case]
    assert_4xx(raw_post(server, "/generate", data), 400)


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": random_prompt(5000, seed=1), "sampling_params": OK},  # longer than the context
        {"input_ids": random_prompt(10, seed=1), "sampling_params": {"max_new_tokens": 10_000}},
        {"text": "hi", "sampling_params": {"temperature": -1}},
        {"text": "hi", "sampling_params": {"top_p": 1.5}},
        {"text": "hi", "sampling_params": {"top_k": 0}},
        {"text": "hi", "sampling_params": {"no_such_param": 1}},
        {"text": "hi", "sampling_params": "greedy"},
        {"input_ids": [1, 2, 10**9], "sampling_params": OK},
        {"input_ids": [], "sampling_params": OK},
        {"text": "hi", "input_ids": [1], "sampling_params": OK},
        {"text": "hi", "mystery_field": 1},
        {"text": "hi", "logprob_start_len": 99, "return_logprob": True},
    ],
)
def test_invalid_requests(server, body):
    assert_4xx(server.post("/generate", body), 400)


def test_oversized_payload_is_413(server):
    big = b'{"text": "' + b"a" * (9 * 1024 * 1024) + b'"}'
    assert_4xx(raw_post(server, "/generate", big), 413)


def test_openai_errors(server):
    chat = {"model": "inkling-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert_4xx(server.post("/v1/chat/completions", {**chat, "model": "gpt-17"}), 404)
    assert_4xx(
        server.post("/v1/chat/completions", {**chat, "messages": [{"role": "wizard", "content": "x"}]}), 400
    )
    assert_4xx(server.post("/v1/chat/completions", {**chat, "temperature": "hot"}), 400)
    assert_4xx(server.post("/v1/chat/completions", {**chat, "max_tokens": 100_000}), 400)
    assert_4xx(raw_post(server, "/v1/completions", b"{oops"), 400)


def test_server_still_serves_after_bad_input(server):
    assert server.get("/health_generate").status_code == 200
    out = server.generate(text="still alive?", sampling_params=OK)
    assert out["meta_info"]["completion_tokens"] == 2
    server.wait_idle_baseline()


@pytest.fixture(scope="module")
def keyed_server(tiny_path):
    s = ServerProcess("--skip-server-warmup", api_key="sekret")
    yield s
    s.stop()


def test_api_key_is_required_when_set(keyed_server):
    url = keyed_server.base_url
    assert_4xx(requests.post(url + "/generate", json={"text": "hi"}, timeout=30), 401)
    assert_4xx(requests.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=30), 401)
    assert keyed_server.generate(text="hi", sampling_params=OK)["meta_info"]["completion_tokens"] == 2
    assert requests.get(url + "/health", timeout=30).status_code == 200
