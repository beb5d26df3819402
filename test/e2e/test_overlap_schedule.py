"""Overlap scheduling through HTTP: the shared server (overlap on, the default) and one started with
--disable-overlap-schedule answer the same concurrent streamed traffic (stop tokens and strings,
logprobs with top logprobs, a regex, sampled with seeds, one aborted mid-stream) with the same
output; both pools come back to the idle baseline. The detailed in-process matrix is
test/unit/test_overlap_schedule.py."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from test.unit.helpers import random_prompt

from .server import ServerProcess


@pytest.fixture(scope="module")
def sync_server(tiny_path):
    s = ServerProcess("--skip-server-warmup", "--disable-overlap-schedule")
    yield s
    s.stop()


def bodies() -> list[dict]:
    greedy = {"temperature": 0, "ignore_eos": True}
    out = []
    for i in range(8):
        sp = {**greedy, "max_new_tokens": 6 + 3 * i}
        body = {"input_ids": random_prompt(10 + 5 * i, seed=700 + i), "sampling_params": sp, "stream": True}
        if i % 3 == 1:
            body.update(return_logprob=True, top_logprobs_num=2)
        out.append(body)
    out[2]["sampling_params"].update(temperature=0.8, top_p=0.9, seed=11)
    out[3]["sampling_params"].update(regex=r"[a-z]{3,9}", ignore_eos=False)
    out[5]["sampling_params"].update(stop=["e"])  # a common letter: likely to stop somewhere
    return out


def stream(server: ServerProcess, body: dict) -> list[dict]:
    with requests.post(server.base_url + "/generate", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        return [json.loads(x[6:]) for x in (b.decode() for b in r.iter_lines()) if x and x != "data: [DONE]"]


def final(chunks: list[dict]) -> dict:
    last = chunks[-1]
    meta = last["meta_info"]
    return {
        "ids": last["output_ids"],
        "text": last["text"],
        "finish": meta["finish_reason"],
        "logprobs": [t for _, t, *_ in meta.get("output_token_logprobs") or []],
        "top": [[t for _, t, *_ in row] for row in meta.get("output_top_logprobs") or []],
    }


def traffic(server: ServerProcess) -> list[dict]:
    with ThreadPoolExecutor(8) as pool:
        return [final(c) for c in pool.map(lambda b: stream(server, b), bodies())]


def aborted_stream(server: ServerProcess) -> list[int]:
    """A long stream whose client goes away after 3 chunks; the server must free it."""
    body = {"input_ids": random_prompt(20, seed=799), "stream": True,
            "sampling_params": {"temperature": 0, "ignore_eos": True, "max_new_tokens": 400}}  # fmt: skip
    with requests.post(server.base_url + "/generate", json=body, stream=True, timeout=120) as r:
        lines = (x for x in (b.decode() for b in r.iter_lines()) if x.startswith("data: {"))
        return [json.loads(next(lines)[6:])["output_ids"] for _ in range(3)][-1]


def test_overlapped_server_answers_as_the_synchronous_one(server, sync_server):
    assert server.internal_state()["overlap_schedule"] is True
    assert sync_server.internal_state()["overlap_schedule"] is False
    before = server.internal_state()["overlap_decode_steps"]
    ref = traffic(sync_server)
    got = traffic(server)
    assert got == ref
    assert ref[3]["finish"]["type"] == "stop"  # the regex closed
    assert all(len(ref[i]["top"]) == len(ref[i]["ids"]) > 0 and ref[i]["logprobs"] for i in (1, 4, 7))
    assert server.internal_state()["overlap_decode_steps"] > before
    assert sync_server.internal_state()["overlap_decode_steps"] == 0
    a, b = aborted_stream(server), aborted_stream(sync_server)
    n = min(len(a), len(b))
    assert a[:n] == b[:n]
    server.wait_idle_baseline()
    sync_server.wait_idle_baseline()
