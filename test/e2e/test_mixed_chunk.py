"""Mixed chunked prefill through HTTP (issue 20 item 3): while a long prompt prefills in several
chunks, a streaming request keeps receiving tokens (seen in the order the SSE chunks arrive), and
the scheduler counts those steps; the pools are back at their idle baseline after."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from test.unit.helpers import random_prompt

from .server import ServerProcess

LONG = 1800  # four chunks of the CPU default (512 tokens per step)


def stream_arrivals(server, ids: list[int], max_new_tokens: int, out: list[float], counts: list[int] | None = None) -> None:
    """POST a streamed /generate; append the arrival time of every chunk that adds tokens (and the
    token count so far to `counts`: a chunk may carry several when the client reads late)."""
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
                if counts is not None:
                    counts.append(n)


@pytest.fixture(scope="module")
def server(tiny_path):
    s = ServerProcess("--skip-server-warmup", "--enable-mixed-chunk")
    yield s
    s.stop()


def test_decode_proceeds_while_a_long_prompt_prefills(server):
    st0 = server.internal_state()
    assert st0["enable_mixed_chunk"] is True and st0["overlap_schedule"] is True  # mixed steps overlap too
    arrivals: list[float] = []
    counts: list[int] = []
    decoder = threading.Thread(target=stream_arrivals, args=(server, random_prompt(8, seed=1), 400, arrivals, counts))
    decoder.start()
    deadline = time.time() + 60
    while len(arrivals) < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert len(arrivals) >= 3, "the decoding request did not start"
    sent = time.perf_counter()
    first: list[float] = []
    stream_arrivals(server, random_prompt(LONG, seed=2), 1, first)  # returns when the long one is done
    before = max(n for t, n in zip(arrivals, counts) if t <= sent)
    gained = max(n for t, n in zip(arrivals, counts) if t < first[0]) - before
    st1 = server.internal_state()
    decoder.join(timeout=120)
    assert counts[-1] == 400
    # Without mixing the decoder gets at most the token of the step in flight at the send, then
    # nothing during the four chunk steps in a row; with it, a token per chunk step (the last one
    # streams with the long prompt's first token).
    assert gained >= 3, (gained, first[0] - sent)
    assert st1["num_mixed_steps"] - st0["num_mixed_steps"] >= 4
    server.wait_idle_baseline()


def test_an_image_prompt_prefilled_under_riders_answers_as_alone(server):
    """A multi-chunk image prompt prefilled while another request decodes (its chunks carry that
    request's tokens; the media embeddings are placed around them) gives the output it gives alone."""
    from test.unit.mm_helpers import data_url, encode_image, picture

    body = {"input_ids": [200000, 200005, 200054, 200010], "return_logprob": True,
            "image_data": [data_url(encode_image(picture(560, 560, seed=5)), "image/png")],
            "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}}  # fmt: skip
    alone = server.generate(**body)
    assert alone["meta_info"]["prompt_tokens"] > 700  # two chunks or more
    assert server.post("/flush_cache").status_code == 200  # the second one must prefill, not hit the cache
    st0 = server.internal_state()
    arrivals: list[float] = []
    decoder = threading.Thread(target=stream_arrivals, args=(server, random_prompt(8, seed=3), 300, arrivals))
    decoder.start()
    while len(arrivals) < 3 and decoder.is_alive():
        time.sleep(0.01)
    ridden = server.generate(**body)
    st1 = server.internal_state()
    decoder.join(timeout=120)
    assert st1["num_mixed_steps"] - st0["num_mixed_steps"] >= 2
    assert ridden["output_ids"] == alone["output_ids"]
    assert ridden["meta_info"]["output_token_logprobs"] == alone["meta_info"]["output_token_logprobs"]
    server.wait_idle_baseline()
