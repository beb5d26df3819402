"""Continuous batching: concurrent requests equal the same requests alone, also under retraction."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from test.unit.helpers import random_prompt

from .server import ServerProcess


def workload(n: int) -> list[dict]:
    return [
        {
            "input_ids": random_prompt(5 + (7 * i) % 60, seed=3000 + i),
            "sampling_params": {"temperature": 0, "max_new_tokens": 8 + (5 * i) % 25, "ignore_eos": True},
        }
        for i in range(n)
    ]


def run_concurrently(server, bodies: list[dict]) -> list[list[int]]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        return [r["output_ids"] for r in pool.map(lambda b: server.generate(**b), bodies)]


def test_32_concurrent_requests_equal_each_alone(server):
    bodies = workload(32)
    alone = [server.generate(**b)["output_ids"] for b in bodies]
    together = run_concurrently(server, bodies)
    assert together == alone
    assert [len(x) for x in together] == [b["sampling_params"]["max_new_tokens"] for b in bodies]
    server.wait_idle_baseline()


@pytest.fixture(scope="module")
def small_server(tiny_path):
    # 500 KV tokens cannot hold 16 requests of up to ~100 tokens each: decode must retract.
    s = ServerProcess("--skip-server-warmup", "--max-total-tokens", "500", "--chunked-prefill-size", "64")
    yield s
    s.stop()


def test_retraction_under_memory_pressure_keeps_outputs_identical(server, small_server):
    bodies = workload(16)
    for b in bodies:
        b["sampling_params"]["max_new_tokens"] += 20
    alone = [server.generate(**b)["output_ids"] for b in bodies]
    together = run_concurrently(small_server, bodies)
    assert together == alone
    st = small_server.wait_idle_baseline()
    assert st["num_retracted_reqs"] > 0, "the memory budget was meant to force retraction"


def test_request_larger_than_memory_is_refused_not_hung(small_server):
    r = small_server.post(
        "/generate", {"input_ids": random_prompt(450, seed=1), "sampling_params": {"max_new_tokens": 200}}
    )
    assert r.status_code == 200
    assert r.json()["meta_info"]["finish_reason"]["type"] == "abort"
    small_server.wait_idle_baseline()
