"""A running request's cached prompt holds about one window of sliding KV, as without the cache
(inkling-tiny-w512: sliding window 512, checkpoints every 128 tokens, float32 on the CPU).

The checkpoint interval is shorter than the window, so every position of a cached prompt lies in
some checkpoint's window, and the prompt's nodes stay locked while the request runs. Before the fix
the sliding pool (half the cache plus a window per running request) held every running prompt
whole: with four 2250-token prompts in a 10,000-token pool the fourth stalled after its first chunk
with full KV free. Now the eviction thins the running paths' checkpoints whose windows reach below
their requests' windows, and frees that sliding KV. References: the same arrivals with
--disable-radix-cache (admission timing and outputs) and a cold run of each request alone.
"""

from __future__ import annotations

import pytest

from .helpers import close_scheduler, random_prompt
from .test_mixed_chunk import Recorder, cold_scheduler, make_scheduler, submit
from .test_overlap_schedule import assert_idle_baseline

WINDOW = 512  # inkling-tiny-w512's sliding window
PROMPT, POOL, CHUNK = 2250, 10_000, 1024
RUNNING = 4


@pytest.fixture(scope="module")
def w512_path():
    from sgl_inkling.models.inkling.tiny_window import ensure_tiny_window_checkpoint

    return str(ensure_tiny_window_checkpoint())


def scheduler(path, tmp_path_factory, **kw):
    return make_scheduler(path, tmp_path_factory, False, chunk=CHUNK, max_total_tokens=POOL,
                          max_running_requests=RUNNING, **kw)  # fmt: skip


def run(s, schedule: dict[int, list], squeeze_at: int | None = None):
    """Submit schedule[i] before step i; run until idle. Returns the recorder, the step at which
    each request finished its prefill, and the sliding KV in use after `squeeze_at` (when the cache
    was made to free every sliding slot it can), with the running requests' kv_len and owned then."""
    rec, i, prefilled, squeezed = Recorder(s), 0, {}, None
    while i <= max(schedule) or rec.busy():
        for kw in schedule.get(i, []):
            submit(s, **kw)
        rec.step()
        i += 1
        for r in s.running:
            prefilled.setdefault(r.rid, i)
        if i == squeeze_at:
            assert len(s.running) == RUNNING and not s.partial, "a prompt is still prefilling: sliding KV ran short"
            s.kv.radix.evict(swa=s.kv.swa.num_slots)  # everything the running requests do not read
            used = s.kv.swa.num_slots - s.kv.swa.available
            squeezed = used, [(r.kv_len, r.owned) for r in s.running]
        assert i < 400, "did not finish"
    assert_idle_baseline(s)
    return rec, prefilled, squeezed


@pytest.fixture(scope="module")
def cold(w512_path, tmp_path_factory):
    with cold_scheduler(w512_path, tmp_path_factory, chunk=4096) as s:
        yield s


def cold_tokens(cold, kw: dict) -> list[int]:
    rec, _, _ = run(cold, {0: [kw]})
    return rec.tokens[kw["rid"]]


def test_running_prompts_hold_one_window_and_later_requests_resume_exactly(w512_path, tmp_path_factory, cold):
    prompts = [random_prompt(PROMPT, seed=2000 + k) for k in range(RUNNING)]
    # After the squeeze, while p1..p3 decode: a request on the whole of running p1's prompt (it
    # resumes where p1's lock holds the window), a follow-up turn of p0 (finishing: it resumes at
    # p0's end) and one sharing 1500 tokens of p2 (its checkpoints there went with the squeeze).
    first = [dict(rid=f"p{k}", ids=prompts[k], max_new_tokens=10 if k == 0 else 16) for k in range(RUNNING)]
    p0_out = cold_tokens(cold, first[0])
    later = [dict(rid="same", ids=prompts[1] + random_prompt(40, seed=2100), max_new_tokens=6),
             dict(rid="turn2", ids=prompts[0] + p0_out + random_prompt(40, seed=2101), max_new_tokens=6),
             dict(rid="part", ids=prompts[2][:1500] + random_prompt(100, seed=2102), max_new_tokens=6)]  # fmt: skip
    cached = scheduler(w512_path, tmp_path_factory)
    plain = scheduler(w512_path, tmp_path_factory, disable_radix_cache=True)
    try:
        assert cached.runner.model.cfg.sliding_window_size == WINDOW and cached.kv.interval == 128
        want, want_at, _ = run(plain, {0: first})
        squeeze = want_at["p3"] + 1
        got, got_at, (used, held) = run(cached, {0: first, squeeze + 1: later}, squeeze_at=squeeze)
    finally:
        close_scheduler(cached)
        close_scheduler(plain)
    # Admitted and prefilled as soon as without the cache (before the fix p3 stalled after a chunk).
    assert got_at == {**want_at, **{kw["rid"]: got_at[kw["rid"]] for kw in later}}
    # Each running request holds the window before its cached prompt's end and its own tokens since.
    bound = sum(WINDOW + kv_len - owned + 1 for kv_len, owned in held)
    assert used <= bound < RUNNING * (WINDOW + 60), (used, held)
    assert used >= RUNNING * (WINDOW - 1), (used, held)  # the windows themselves are still there
    for kw in first:
        assert got.tokens[kw["rid"]] == want.tokens[kw["rid"]], kw["rid"]
    assert got.tokens["p0"] == p0_out
    assert got.tokens["p3"] == cold_tokens(cold, first[3])  # p1 and p2 as p3: the plain run's only, for time
    for kw in later:
        assert got.tokens[kw["rid"]] == cold_tokens(cold, kw), kw["rid"]
    assert got.cached["same"] >= PROMPT - 1 and got.cached["turn2"] > PROMPT, got.cached
