"""Mixed chunked prefill through HTTP (issue 20 item 3): while a long prompt prefills in several
chunks, a streaming request keeps receiving tokens (seen in the order the SSE chunks arrive), and
the scheduler counts those steps; the pools are back at their idle baseline after."""

from __future__ import annotations

import json
import threading
import time

import requests

from test.unit.helpers import random_prompt

LONG = 1800  # four chunks of the CPU default (512 tokens per step)


def stream_arrivals(server, ids: list[int], max_new_tokens: int, out: list[float]) -> None:
    """POST a streamed /generate; append the arrival time of every chunk that adds tokens."""
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}}  # fmt: skip
    seen = 0
    with requests.post(server.base_url + "/generate", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        for raw in r.iter_lines():  # bytes: split before decoding
            if not raw.startswith(b"data:") or raw.strip() == b"data: [DONE]":
                continue
            n = json.loads(raw[5:].decode())["meta_info"]["completion_tokens"]
            if n > seen:
                out.append(time.perf_counter())
                seen = n


def test_decode_proceeds_while_a_long_prompt_prefills(server):
    st0 = server.internal_state()
    assert st0["enable_mixed_chunk"] is True  # the default without MTP
    arrivals: list[float] = []
    decoder = threading.Thread(target=stream_arrivals, args=(server, random_prompt(8, seed=1), 400, arrivals))
    decoder.start()
    deadline = time.time() + 60
    while len(arrivals) < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert len(arrivals) >= 3, "the decoding request did not start"
    sent = time.perf_counter()
    first: list[float] = []
    stream_arrivals(server, random_prompt(LONG, seed=2), 1, first)  # returns when the long one is done
    during = [t for t in arrivals if sent < t < first[0]]
    st1 = server.internal_state()
    decoder.join(timeout=120)
    assert len(arrivals) == 400
    # Without mixing the decoder gets nothing between the send and the end of the prefill (four
    # chunk steps in a row); with it, a token per chunk step (its last one may stream just after).
    assert len(during) >= 3, (len(during), first[0] - sent)
    assert st1["num_mixed_steps"] - st0["num_mixed_steps"] >= 4
    server.wait_idle_baseline()
