"""The prefix cache on Inkling's real attention reach (window 512, inkling-tiny-w512): exact resume for
repeats, strict prefixes, node boundaries and prompt-logprob requests; a hot shared prefix; follow-up
turns under memory pressure. Every result is bitwise equal to a server without the cache."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from test.unit.helpers import random_prompt

from .server import ServerProcess
from .test_radix_cache import GREEDY, assert_same

INTERVAL = 128  # DEFAULT_SCONV_CHECKPOINT_INTERVAL
CHUNK = 512  # --chunked-prefill-size on the CPU


@pytest.fixture(scope="module")
def w512_path():
    from sgl_inkling.models.inkling.tiny_window import ensure_tiny_window_checkpoint

    return str(ensure_tiny_window_checkpoint())


@pytest.fixture(scope="module")
def hot(w512_path):
    s = ServerProcess("--skip-server-warmup", "--model-path", w512_path)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def cold(w512_path):
    s = ServerProcess("--skip-server-warmup", "--model-path", w512_path, "--disable-radix-cache")
    yield s
    s.stop()


def gen(server, ids: list[int], **body) -> dict:
    body = {"sampling_params": GREEDY, "return_logprob": True, "top_logprobs_num": 5, **body}
    return server.generate(input_ids=ids, **body)


def both(hot, cold, ids: list[int], **body) -> int:
    """Run on both servers, require identical results; the hot server's cached token count."""
    h, c = gen(hot, ids, **body), gen(cold, ids, **body)
    assert_same(h, c)
    assert h["meta_info"].get("input_token_logprobs") == c["meta_info"].get("input_token_logprobs")
    return h["meta_info"]["cached_tokens"]


def first_pass_points(n: int) -> set[int]:
    """Where a cold computation of n prompt tokens leaves checkpoints: the interval grid, both sides
    of every chunk end, and n - 1."""
    points = set(range(INTERVAL, n, INTERVAL)) | {n - 1, n}
    for e in range(CHUNK, n, CHUNK):
        points |= {e - 1, e}
    return points


def test_repeat_strict_prefix_node_boundary_and_logprobs_resume_at_len_minus_1(hot, cold):
    p = random_prompt(1300, seed=500)
    assert [both(hot, cold, p) for _ in range(3)] == [0, 1299, 1299]
    q = p[:1000]  # strict prefix: first time from the deepest checkpoint below, then exactly
    assert both(hot, cold, q) == max(x for x in first_pass_points(len(p)) if x <= 999)
    assert both(hot, cold, q) == 999
    base = random_prompt(900, seed=501)
    assert both(hot, cold, base + random_prompt(40, seed=502)) == 0
    assert both(hot, cold, base + random_prompt(60, seed=503)) == 896  # first to diverge: < 128 lost
    assert both(hot, cold, base) == 899  # ends on the divergence node
    # Prompt logprobs (as `select` sends them): the key is cut at logprob_start_len.
    lp = random_prompt(800, seed=504)
    sel = {"return_logprob": True, "logprob_start_len": 600, "sampling_params": {**GREEDY, "max_new_tokens": 0}}
    assert both(hot, cold, lp, **sel) == 0
    assert both(hot, cold, lp, **sel) == 599
    assert both(hot, cold, lp[:600] + random_prompt(150, seed=505), **sel) == 599
    st = hot.wait_idle_baseline()
    assert st["radix_end_checkpoints_missing"] == 0


def test_hot_shared_prefix_with_long_turns(hot, cold):
    system = random_prompt(3000, seed=600)
    cached = [both(hot, cold, system + random_prompt(300 + 57 * i, seed=610 + i)) for i in range(9)]
    assert cached[0] == 0
    assert all(c >= 3000 - INTERVAL for c in cached[1:]), cached  # first to diverge: < 128 recomputed
    assert all(c == 3000 for c in cached[2:]), cached  # then exactly at the divergence
    st = hot.wait_idle_baseline()
    assert st["radix_recomputed_tokens"] >= 3000 - cached[1]


@pytest.fixture(scope="module")
def pressed(w512_path):
    s = ServerProcess(
        "--skip-server-warmup", "--model-path", w512_path, "--max-total-tokens", "8000",
        "--max-running-requests", "2",
    )  # fmt: skip
    yield s
    s.stop()


def test_follow_ups_under_memory_pressure_resume_at_their_turn_end(pressed, cold):
    firsts = [random_prompt(800 + 29 * i, seed=700 + i) for i in range(12)]  # 11K tokens, 8K fit
    sp = {**GREEDY, "max_new_tokens": 8}
    with ThreadPoolExecutor(len(firsts)) as pool:
        outs = list(pool.map(lambda p: gen(pressed, p, sampling_params=sp), firsts))
    for o, p in zip(outs, firsts):
        assert_same(o, gen(cold, p, sampling_params=sp))
    before = pressed.internal_state()
    follow = [p + o["output_ids"] + random_prompt(50, seed=800 + i) for i, (p, o) in enumerate(zip(firsts, outs))]
    with ThreadPoolExecutor(len(follow)) as pool:
        again = list(pool.map(lambda p: gen(pressed, p, sampling_params=sp), follow))
    for o, p in zip(again, follow):
        assert_same(o, gen(cold, p, sampling_params=sp))
    after = pressed.wait_idle_baseline()
    # A turn ends at its last token's position; overlapped, the step after it finished also fed that
    # token (scheduler_overlap.py) unless memory was short and that step ran synchronously.
    extra = (0, 1) if after["overlap_schedule"] else (0,)
    turn_ends = [len(p) + len(o["output_ids"]) - 1 for p, o in zip(firsts, outs)]
    got = [o["meta_info"]["cached_tokens"] for o in again]
    misses = sum(g - e not in extra for g, e in zip(got, turn_ends))
    # A follow-up that does not resume at its turn's end lost that turn's KV (with its end-of-turn
    # checkpoint) to eviction, and the counters show it; checkpoints never ran out on their own.
    evicted = after["radix_evicted_end_checkpoints"] - before["radix_evicted_end_checkpoints"]
    assert misses <= evicted, (got, turn_ends, evicted)
    assert after["radix_end_checkpoints_missing"] == 0
    assert after["radix_snapshots_skipped"] == 0
    # Old paths were thinned (intermediate checkpoints and the sliding KV only they needed) before
    # any full KV was dropped: sliding KV has half the slots of full KV.
    assert after["radix_thinned_swa_tokens"] > before["radix_thinned_swa_tokens"]
    # FCFS admission with LRU alone thrashes here (each miss evicting the next follow-up's prefix);
    # queued requests' prefixes are evicted last, so only the misses running at once take one.
    assert len(follow) - misses >= 4, (got, turn_ends)
