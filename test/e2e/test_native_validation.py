"""Native /generate validation at the edge (issue 18: items 1, 3, 4, 8 and the `n` part of 13).

Each bad body is a 400 naming the field, while a long request already in flight finishes unharmed,
and every pool is back at its idle baseline afterwards. `n > 1` with one prompt samples that prompt.
"""

from __future__ import annotations

import threading

import pytest
import requests

from test.unit.helpers import random_prompt

from .test_bad_input import raw_post

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
LONG = 160

BAD = {
    "n string": ({"text": "hi", "sampling_params": {"n": "5"}}, "sampling_params.n"),
    "n float": ({"text": "hi", "sampling_params": {"n": 1.5}}, "sampling_params.n"),
    "n zero": ({"text": "hi", "sampling_params": {"n": 0}}, "sampling_params.n"),
    "n negative": ({"text": "hi", "sampling_params": {"n": -3}}, "sampling_params.n"),
    "n huge": ({"text": "hi", "sampling_params": {"n": 2**70}}, "sampling_params.n"),
    "n 2000": ({"text": "hi", "sampling_params": {"n": 2000}}, "sampling_params.n"),
    "n bool": ({"text": "hi", "sampling_params": {"n": True}}, "sampling_params.n"),
    "top logprobs": ({"text": "hi", "return_logprob": True, "top_logprobs_num": 10**6}, "top_logprobs_num"),
    "logit bias id": ({"text": "hi", "sampling_params": {"logit_bias": {"10000000": 5}}}, "logit_bias"),
    "internal mm_items": ({"text": "hi", "mm_items": [{"kind": "image"}]}, "mm_items"),
    "internal grammar": ({"text": "hi", "grammar": "root ::= 'a'"}, "grammar"),
    "duplicate rids": ({"text": ["a", "b"], "rid": ["same", "same"]}, "same"),
    "short params list": ({"text": ["a", "b", "c"], "sampling_params": [GREEDY]}, "sampling_params"),
    "short rid list": ({"input_ids": [[1, 2], [3]], "rid": ["x"]}, "rid"),
    "list for one prompt": ({"text": "a", "return_logprob": [True, False]}, "return_logprob"),
    "empty text": ({"text": "", "sampling_params": GREEDY}, "empty"),
    "empty text n": ({"text": "", "sampling_params": {**GREEDY, "n": 2}}, "empty"),
    "empty batch": ({"text": []}, "empty"),
    "stop_regex invalid": ({"text": "hi", "sampling_params": {"stop_regex": "(unclosed"}}, "stop_regex"),
    "routed experts": ({"text": "hi", "return_routed_experts": True}, "return_routed_experts"),
    "beam search": ({"text": "hi", "sampling_params": {"beam_width": 4}}, "beam_width"),
    "lora": ({"text": "hi", "lora_path": "my-adapter"}, "lora_path"),
}


@pytest.fixture(scope="module")
def long_request(server):
    """A long generation in flight while the bad bodies arrive; its answer is checked at the end."""
    result: dict = {}
    body = {"input_ids": random_prompt(20, seed=3), "sampling_params": {**GREEDY, "max_new_tokens": LONG}}

    def run():
        result["response"] = server.post("/generate", body)

    result["thread"] = t = threading.Thread(target=run)
    t.start()
    yield result
    t.join(timeout=600)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_native_bodies_are_400_naming_the_field(server, long_request, case):
    body, named = BAD[case]
    r = server.post("/generate", body)
    assert r.status_code == 400, (case, r.status_code, r.text)
    assert named in r.json()["message"], r.json()["message"]


def test_nan_n_is_400(server):
    r = raw_post(server, "/generate", b'{"text": "hi", "sampling_params": {"n": NaN}}')
    assert r.status_code == 400 and "n" in r.json()["message"]


def test_bounds_at_the_limit_are_served(server, long_request):
    out = server.generate(text="hi", sampling_params=GREEDY, return_logprob=True, top_logprobs_num=20)
    assert all(len(pos) == 20 for pos in out["meta_info"]["output_top_logprobs"])
    biased = server.generate(text="hi", sampling_params={**GREEDY, "logit_bias": {"17": 100}})
    assert biased["output_ids"] == [17] * GREEDY["max_new_tokens"]


def test_n_samples_one_prompt(server, long_request):
    text = "The quick brown fox"
    single = server.generate(text=text, sampling_params=GREEDY)
    many = server.generate(text=text, sampling_params={**GREEDY, "n": 3})
    assert isinstance(many, list) and len(many) == 3
    for out in many:  # the whole prompt, not its first character
        assert out["meta_info"]["prompt_tokens"] == single["meta_info"]["prompt_tokens"] > 1
        assert out["output_ids"] == single["output_ids"]
    ids = random_prompt(9, seed=4)
    one = server.generate(input_ids=ids, sampling_params=GREEDY)
    two = server.generate(input_ids=ids, sampling_params={**GREEDY, "n": 2})
    assert [o["output_ids"] for o in two] == [one["output_ids"]] * 2
    assert all(o["meta_info"]["prompt_tokens"] == len(ids) for o in two)
    batch = server.generate(text=["a", text], sampling_params=[GREEDY, {**GREEDY, "n": 2}], rid="job")
    assert len(batch) == 3 and batch[1]["output_ids"] == batch[2]["output_ids"] == single["output_ids"]
    assert [o["meta_info"]["id"] for o in batch] == ["job_0", "job_1", "job_2"]  # a rid prefixes a batch's


def test_in_flight_request_unharmed_and_pools_idle(server, long_request):
    # Runs after the cases above (file order): the long request was in flight throughout.
    long_request["thread"].join(timeout=600)
    r: requests.Response = long_request["response"]
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert meta["completion_tokens"] == LONG and meta["finish_reason"]["type"] == "length"
    assert server.get("/health_generate").status_code == 200
    server.wait_idle_baseline()
