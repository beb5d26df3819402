"""`--dp-size 2`: two replicas behind the data-parallel controller in one server.

The reference is the single-replica `server` fixture: greedy outputs must be identical, every
request must come back through the detokenizer, both replicas must serve, aborts must reach the
replica holding the request, and flush_cache must leave every replica's pools idle.
"""

from __future__ import annotations

import threading
import time

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from test.unit.helpers import random_prompt

from .server import ServerProcess

GREEDY = {"max_new_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def dp2(tiny_path):
    s = ServerProcess("--dp-size", "2", "--skip-server-warmup", "--enable-metrics")
    yield s
    s.stop()


def _per_replica(s: ServerProcess, key: str) -> list[int]:
    return [r[key] for r in s.internal_state()["replicas"]]


def test_dp2_greedy_matches_dp1_and_uses_both_replicas(server, dp2):
    before = _per_replica(dp2, "num_finished_reqs")
    prompts = [random_prompt(12 + k, seed=40 + k) for k in range(4)]
    want = [server.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in prompts]
    got = [dp2.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in prompts]
    assert got == want
    batch = dp2.generate(input_ids=prompts, sampling_params=GREEDY)  # one HTTP request, spread out
    assert [b["output_ids"] for b in batch] == want
    streamed = dp2.post(
        "/generate", {"text": "Hello", "sampling_params": GREEDY, "stream": True}, stream=True
    )
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    served = [a - b for a, b in zip(_per_replica(dp2, "num_finished_reqs"), before)]
    assert sum(served) == 9 and min(served) >= 4, served  # round robin
    dp2.wait_idle_baseline()  # /flush_cache reached both: every pool of both replicas is full


def test_pinned_rank_and_abort_reach_the_right_replica(dp2):
    before = _per_replica(dp2, "num_finished_reqs")
    for _ in range(2):
        dp2.generate(text="Hi", sampling_params=GREEDY, data_parallel_rank=1)
    assert [a - b for a, b in zip(_per_replica(dp2, "num_finished_reqs"), before)] == [0, 2]
    client = openai.OpenAI(base_url=dp2.base_url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "Hi"}]
    client.chat.completions.create(
        model="inkling-tiny", messages=messages, max_tokens=2, extra_body={"data_parallel_rank": 0}
    )
    client.completions.create(
        model="inkling-tiny", prompt="Hi", max_tokens=2, extra_body={"data_parallel_rank": 0}
    )
    assert [a - b for a, b in zip(_per_replica(dp2, "num_finished_reqs"), before)] == [2, 2]
    bad = dp2.post("/generate", {"text": "Hi", "data_parallel_rank": 2})
    assert bad.status_code == 400 and "data_parallel_rank" in bad.json()["message"]

    result = {}
    long = {"temperature": 0, "max_new_tokens": 3000, "ignore_eos": True}
    body = {"input_ids": random_prompt(20, seed=5), "sampling_params": long, "rid": "dp-victim"}

    def run():
        result["out"] = dp2.generate(**body, data_parallel_rank=1)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 30
    while _per_replica(dp2, "num_running_reqs")[1] == 0 and time.time() < deadline:
        time.sleep(0.05)
    assert dp2.post("/abort_request", {"rid": "dp-victim"}).status_code == 200
    t.join(timeout=60)
    meta = result["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 3000
    dp2.wait_idle_baseline()


def test_dp2_reports_both_replicas(dp2):
    info = dp2.get("/get_server_info").json()
    assert info["dp_size"] == 2 and info["internal_states"][0]["dp_size"] == 2
    loads = dp2.get("/get_load").json()
    assert [entry["dp_rank"] for entry in loads] == [0, 1]
    families = {f.name: f for f in text_string_to_metric_families(dp2.get("/metrics").text)}
    total = sum(_per_replica(dp2, "full_kv_total"))
    (sample,) = families["sglang:max_total_num_tokens"].samples
    assert sample.labels == {"model_name": "inkling-tiny"} and sample.value == total
