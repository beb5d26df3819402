"""Prefix reuse through the radix tree: bitwise-equal results, hits at any prefix length, eviction,
sharing, aborts; pools back at baseline."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from test.unit.helpers import random_prompt

from .server import ServerProcess

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def cold(tiny_path):
    s = ServerProcess("--skip-server-warmup", "--disable-radix-cache")
    yield s
    s.stop()


def gen(server, ids: list[int], **sp) -> dict:
    return server.generate(
        input_ids=ids, sampling_params={**GREEDY, **sp}, return_logprob=True, top_logprobs_num=20
    )


def assert_same(hot: dict, ref: dict) -> None:
    """Same tokens and bit-identical log-probabilities (JSON carries float32 values exactly)."""
    assert hot["output_ids"] == ref["output_ids"]
    assert hot["meta_info"]["output_token_logprobs"] == ref["meta_info"]["output_token_logprobs"]
    assert hot["meta_info"]["output_top_logprobs"] == ref["meta_info"]["output_top_logprobs"]


def test_shared_prefixes_hit_and_stay_bitwise_equal_to_cold(server, cold):
    base = random_prompt(137, seed=4242)  # lengths below match no chunk, page or window size
    a = base + random_prompt(29, seed=1)
    b = base + random_prompt(53, seed=2)  # diverges at 137: resumes at a's last interval checkpoint
    c = base + random_prompt(41, seed=3)  # resumes exactly at the divergence point
    d = base[:101] + random_prompt(7, seed=4)  # splits inside the cached prefix
    e = base[:101] + random_prompt(75, seed=5)
    results = {}
    for name, ids in [("a", a), ("b", b), ("c", c), ("d", d), ("e", e)]:
        results[name] = hot = gen(server, ids)
        assert_same(hot, gen(cold, ids))
    # A checkpoint every 128 prompt tokens by default (DEFAULT_SCONV_CHECKPOINT_INTERVAL).
    cached = {k: v["meta_info"]["cached_tokens"] for k, v in results.items()}
    assert cached["a"] == 0
    assert cached["b"] == 128  # the first to diverge loses less than one interval...
    assert cached["c"] == 137  # ...and leaves a checkpoint exactly at the divergence point
    assert cached["d"] == 0  # no checkpoint below 101 yet
    assert cached["e"] == 101
    # Multi-turn: the next prompt extends the previous prompt and answer.
    turn2 = a + results["a"]["output_ids"] + random_prompt(19, seed=6)
    hot = gen(server, turn2)
    assert_same(hot, gen(cold, turn2))
    # Synchronously a's last token never went through the model; overlapped, the step after a finished
    # consumed it (see scheduler_overlap.py), so the cache holds the whole turn.
    unfed = 0 if server.internal_state()["overlap_schedule"] else 1
    assert hot["meta_info"]["cached_tokens"] == len(a) + len(results["a"]["output_ids"]) - unfed
    server.wait_idle_baseline()


def test_concurrent_requests_sharing_and_extending_one_prefix(server, cold):
    prefix = random_prompt(83, seed=777)
    prompts = [prefix + random_prompt(3 + 11 * i, seed=800 + i) for i in range(8)]
    prompts.append(prefix)  # one request is the shared prefix itself
    with ThreadPoolExecutor(len(prompts)) as pool:
        hot = list(pool.map(lambda p: gen(server, p), prompts))
    for h, p in zip(hot, prompts):
        assert_same(h, gen(cold, p))
    server.wait_idle_baseline()


def test_abort_while_the_prefix_node_is_locked(server):
    prefix = random_prompt(70, seed=999)
    gen(server, prefix + [5])  # cache the prefix
    result = {}

    def run():
        result["out"] = server.generate(
            input_ids=prefix + [7, 8],
            sampling_params={"temperature": 0, "max_new_tokens": 3000, "ignore_eos": True},
            rid="locked-victim",
        )

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 30
    while server.internal_state()["num_running_reqs"] == 0 and time.time() < deadline:
        time.sleep(0.05)
    server.post("/abort_request", {"rid": "locked-victim"})
    t.join(timeout=60)
    assert result["out"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert result["out"]["meta_info"]["cached_tokens"] > 0
    server.wait_idle_baseline()


@pytest.fixture(scope="module")
def tiny_budget(tiny_path):
    s = ServerProcess("--skip-server-warmup", "--max-total-tokens", "260", "--chunked-prefill-size", "48")
    yield s
    s.stop()


def test_eviction_under_a_tiny_memory_budget(tiny_budget, cold):
    shared = random_prompt(57, seed=31)
    prompts = [shared + random_prompt(20 + 9 * i, seed=40 + i) for i in range(6)]
    prompts += [random_prompt(90, seed=60), shared + random_prompt(5, seed=61)]
    for p in prompts:  # sequential: each insert pushes older leaves out of 260 slots
        assert_same(gen(tiny_budget, p), gen(cold, p))
    st = tiny_budget.wait_idle_baseline()
    assert st["radix_cached_tokens"] <= 260
    with ThreadPoolExecutor(4) as pool:  # and concurrently, with retraction in the mix
        hot = list(pool.map(lambda p: gen(tiny_budget, p), prompts[:4]))
    for h, p in zip(hot, prompts[:4]):
        assert_same(h, gen(cold, p))
    tiny_budget.wait_idle_baseline()
