"""Issue 18 items 5, 6, 7 and 13 through HTTP: hostile bodies are 4xx on every endpoint, aborts touch
only what they name, the body limit holds for chunked bodies, the API key is never echoed and media
paths give no existence oracle. A long request in flight finishes unharmed; pools return to idle."""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time

import pytest
import requests

from .bystander import Bystander, body
from .server import ServerProcess

CHAT = {"model": "inkling-tiny", "max_tokens": 2}
DEEP = b"[" * 100_000 + b"]" * 100_000
BODIES = {  # endpoint -> (a body nesting DEEP, a body with a lone surrogate in its text)
    "/generate": (b'{"text": "hi", "sampling_params": {"stop": ' + DEEP + b"}}", b'{"text": "a\\ud800b"}'),
    "/v1/completions": (b'{"model": "inkling-tiny", "prompt": ' + DEEP + b"}",
                        b'{"model": "inkling-tiny", "prompt": "\\udc00", "max_tokens": 2}'),
    "/v1/chat/completions": (b'{"model": "inkling-tiny", "messages": ' + DEEP + b"}",
                             b'{"model": "inkling-tiny", "max_tokens": 2, '
                             b'"messages": [{"role": "user", "content": "x\\ud83d"}]}'),
    "/abort_request": (b'{"rid": ' + DEEP + b"}", b'{"rid": "\\ud800"}'),
}  # fmt: skip


def raw(server, path, data, headers=None):
    h = {"Content-Type": "application/json", **server.headers, **(headers or {})}
    return requests.post(server.base_url + path, data=data, headers=h, timeout=60)


def assert_400(r) -> str:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    message = r.json()["message"]
    assert isinstance(message, str) and message
    return message


@pytest.mark.parametrize("path", sorted(BODIES))
def test_deep_nesting_and_lone_surrogates_are_400(server, path):
    deep, surrogate = BODIES[path]
    with Bystander(server):
        assert_400(raw(server, path, deep))
        assert_400(raw(server, path, surrogate))
    server.wait_idle_baseline()


@pytest.mark.parametrize("payload", [{}, {"abort_all": False}, {"rid": ""}, {"rid": "nobody-has-this-rid"}])
def test_abort_request_without_abort_all_touches_nobody(server, payload):
    with Bystander(server):
        assert server.post("/abort_request", payload).status_code == 200
    server.wait_idle_baseline()


@pytest.mark.parametrize("payload", [{"abort_all": "yes"}, {"rid": 5}, {"rid": "x", "everything": True}])
def test_abort_request_with_bad_fields_is_400(server, payload):
    with Bystander(server):
        assert_400(server.post("/abort_request", payload))
    server.wait_idle_baseline()


def test_abort_all_aborts_every_request(server):
    out = {}
    t = threading.Thread(target=lambda: out.update(r=server.post("/generate", body(41, 3000))))
    t.start()
    deadline = time.time() + 30
    while server.internal_state()["num_running_reqs"] == 0:
        assert time.time() < deadline
        time.sleep(0.02)
    assert server.post("/abort_request", {"abort_all": True}).status_code == 200
    t.join(timeout=60)
    meta = out["r"].json()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 3000
    server.wait_idle_baseline()


def _chunked_post(server, path: str, chunks) -> tuple[int, bytes, int]:
    """POST with Transfer-Encoding: chunked; stops sending once the server answers. Returns the
    status, the response body and how many body bytes were sent."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()  # fmt: skip
    sock.sendall(head)
    sent = 0
    try:
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # the server has answered: stop sending
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        else:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    status, data = resp.status, resp.read()
    sock.close()
    return status, data, sent


def test_chunked_body_over_the_limit_is_413_without_reading_it_all(server):
    limit = server.get("/get_server_info").json()["max_payload_bytes"]
    mb = b"a" * (1 << 20)

    def huge():
        yield b'{"text": "'
        for _ in range(300):  # 300 MB if the server read it all
            yield mb

    with Bystander(server):
        status, data, sent = _chunked_post(server, "/generate", huge())
        assert status == 413 and b"exceeds" in data, data[:200]
        assert sent < limit + 64 * len(mb), f"the client could send {sent} bytes"
        # A chunked body within the limit is read and served.
        small = [b'{"text": "chunk', b'ed", "sampling_params": {"max_new_tokens": 2}}']
        status, data, _ = _chunked_post(server, "/generate", iter(small))
        assert status == 200, data
    server.wait_idle_baseline()


def test_local_media_paths_answer_the_same_whether_or_not_they_exist(server, tmp_path):
    existing = tmp_path / "real.png"
    existing.write_bytes(b"\x89PNG not really")

    def answer(path: str) -> tuple[int, str]:
        r = server.post("/generate", {"text": "<image>", "image_data": path, "sampling_params": {"max_new_tokens": 1}})
        return r.status_code, r.json()["message"].replace(path, "PATH")

    for form in ("{}", "file://{}"):
        a, b = answer(form.format(existing)), answer(form.format(tmp_path / "missing.png"))
        assert a == b and 400 <= a[0] < 500, (a, b)


@pytest.fixture(scope="module")
def keyed(tiny_path, tmp_path_factory):
    media = tmp_path_factory.mktemp("media")
    s = ServerProcess("--skip-server-warmup", "--allowed-local-media-path", str(media), api_key="sekret-key")
    s.media = media
    yield s
    s.stop()


def test_api_key_is_never_echoed(keyed):
    info = keyed.get("/get_server_info")
    assert info.status_code == 200 and "sekret-key" not in info.text
    wrong = {"Authorization": "Bearer sekret-kez"}  # same length, last byte differs
    assert requests.get(keyed.base_url + "/get_server_info", headers=wrong, timeout=30).status_code == 401


def test_media_paths_inside_and_outside_the_allowed_directory_look_alike(keyed, tmp_path):
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"\x89PNG not really")
    answers = set()
    for path in (outside, tmp_path / "missing.png", keyed.media / "missing.png", keyed.media / "sub"):
        r = keyed.post("/generate", {"text": "<image>", "image_data": str(path),
                                     "sampling_params": {"max_new_tokens": 1}})  # fmt: skip
        assert 400 <= r.status_code < 500, r.text
        answers.add((r.status_code, r.json()["message"].replace(str(path), "PATH")))
    assert len(answers) == 1, answers
    keyed.wait_idle_baseline()
