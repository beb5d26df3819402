"""Mixed chunked prefill with overlap scheduling on Inkling's real attention reach (inkling-tiny-w512:
sliding window 512, relative extent 1024), in float32 on the CPU.

test_mixed_overlap.py proves the path on inkling-tiny (window 16); here prompts of 600-1500 tokens
prefill in chunks of 192 (not a divisor of 512: chunk ends fall inside windows) while others decode,
so chunks cross the window and the relative extent, riders cross position 512, and the prefix
cache's checkpoints (the interval grid, chunk ends, divergence points) land inside windows and are
snapshotted by overlapped mixed steps. Two references: the same arrivals on a scheduler with neither
mixing nor overlap, and a cold run of each request alone (no prefix cache, whole-prompt prefill).
Greedy tokens are equal and fp32 logprobs within 1e-5; every mixed step ran overlapped; the pools
end at their idle baseline (drive() checks it)."""

from __future__ import annotations

import pytest

from .helpers import close_scheduler, random_prompt
from .test_mixed_chunk import cold_scheduler, make_scheduler
from .test_mixed_overlap import assert_same_logprobs, drive, run_both

WINDOW, EXTENT = 512, 1024  # inkling-tiny-w512's sliding window and relative-position extent
INTERVAL = 128  # DEFAULT_SCONV_CHECKPOINT_INTERVAL
CHUNK = 192  # --chunked-prefill-size: 512 = 2.67 chunks


@pytest.fixture(scope="module")
def w512_path():
    from sgl_inkling.models.inkling.tiny_window import ensure_tiny_window_checkpoint

    return str(ensure_tiny_window_checkpoint())


@pytest.fixture(scope="module")
def pair(w512_path, tmp_path_factory):
    """(mixed + overlapped, plain + synchronous) schedulers with the prefix cache on."""
    s = [make_scheduler(w512_path, tmp_path_factory, True, chunk=CHUNK),
         make_scheduler(w512_path, tmp_path_factory, False, chunk=CHUNK, disable_overlap_schedule=True)]  # fmt: skip
    assert s[0].overlap and s[0].mixed_chunk and not s[1].overlap and not s[1].mixed_chunk
    assert s[0].runner.model.cfg.sliding_window_size == WINDOW and s[0].kv.interval == INTERVAL
    yield s
    for x in s:
        close_scheduler(x)


@pytest.fixture(scope="module")
def cold(w512_path, tmp_path_factory):
    with cold_scheduler(w512_path, tmp_path_factory) as s:
        yield s


def cold_run(cold, kw: dict):
    rec, _ = drive(cold, {0: [kw]})
    return rec


def assert_as_cold(cold, got, requests: list[dict]) -> None:
    """Each request's output (tokens, finish reason, output / top / prompt logprobs) is its cold run's."""
    for kw in requests:
        rid, want = kw["rid"], cold_run(cold, kw)
        assert got.tokens[rid] == want.tokens[rid], rid
        assert got.reasons[rid] == want.reasons[rid], rid
        assert_same_logprobs(got, want, rid)


def crosses(start: int, n: int, at: int) -> bool:
    return start < at < start + n


def test_long_prompts_prefill_across_the_window_while_others_decode(pair, cold):
    """Prompts of 617-1499 tokens arrive while others decode (one decodes across position 512 riding
    in mixed steps), with output, top and prompt logprobs and a seeded sampled request."""
    lp = {"return_logprob": True, "top_logprobs_num": 3}
    schedule = {
        0: [dict(rid="d0", ids=random_prompt(40, seed=1000), max_new_tokens=40),
            dict(rid="d1", ids=random_prompt(500, seed=1001), max_new_tokens=30, logprobs=lp)],  # decodes past 512
        # Prompt logprobs from inside the first window to past it.
        2: [dict(rid="p617", ids=random_prompt(617, seed=1002), max_new_tokens=12,
                 logprobs={**lp, "logprob_start_len": 300})],
        3: [dict(rid="seeded", ids=random_prompt(900, seed=1003), max_new_tokens=20, temperature=1.0,
                 sampling_seed=7)],
        5: [dict(rid="p1499", ids=random_prompt(1499, seed=1004), max_new_tokens=10, logprobs=lp)],
        9: [dict(rid="p1100", ids=random_prompt(1100, seed=1005), max_new_tokens=16)],
    }  # fmt: skip
    got, mixed_steps = run_both(pair, schedule)
    requests = [kw for kws in schedule.values() for kw in kws]
    assert set(got.tokens) == {kw["rid"] for kw in requests}
    assert all(len(got.tokens[kw["rid"]]) == kw["max_new_tokens"] for kw in requests)
    assert len(got.inputs["p617"]) == 617 - 300 and len(got.tops["d1"]) == 30
    assert_as_cold(cold, got, requests)
    # The geometry was exercised by overlapped mixed steps: chunks that cross the window and the
    # relative extent, chunk ends inside windows, a rider decoding across position 512.
    chunks = [c for m in mixed_steps for c in m.chunks]
    assert any(crosses(start, n, WINDOW) for _, start, n in chunks)
    assert any(crosses(start, n, EXTENT) for _, start, n in chunks)
    assert any(start > EXTENT for _, start, _ in chunks)
    assert any((start + n) % WINDOW and (start + n) % INTERVAL for _, start, n in chunks)
    d1 = [m.riders["d1"] for m in mixed_steps if "d1" in m.riders]
    assert min(d1) < WINDOW <= max(d1), d1


def test_second_wave_resumes_from_prefixes_cached_by_overlapped_mixed_steps(pair, cold):
    """Wave 1 prefills (and caches) long prompts while a request decodes; wave 2 shares prefixes
    longer than the window ending off the checkpoint grid (a divergence, a branch, a repeat, a
    follow-up turn) and wave 3 reuses wave 2's divergence point, all prefilled in overlapped mixed
    steps. Each continues exactly as its cold run, from the cache."""
    a, b, c = random_prompt(1100, seed=1100), random_prompt(1500, seed=1101), random_prompt(700, seed=1102)
    c_out = cold_run(cold, dict(rid="c", ids=c, max_new_tokens=24)).tokens["c"]
    schedule = {
        0: [dict(rid="bg", ids=random_prompt(60, seed=1103), max_new_tokens=150),
            dict(rid="a", ids=a, max_new_tokens=8), dict(rid="b", ids=b, max_new_tokens=8)],
        2: [dict(rid="c", ids=c, max_new_tokens=24)],
        # While b is still prefilling: resumes from what b has cached so far.
        12: [dict(rid="b_twin", ids=b[:1300] + random_prompt(100, seed=1108), max_new_tokens=8)],
        45: [dict(rid="a_div", ids=a[:1000] + random_prompt(150, seed=1104), max_new_tokens=8),
             dict(rid="b_branch", ids=b[:777] + random_prompt(400, seed=1105), max_new_tokens=8),
             dict(rid="b_rep", ids=b, max_new_tokens=8),
             dict(rid="c_turn", ids=c + c_out + random_prompt(90, seed=1106), max_new_tokens=8)],
        75: [dict(rid="a_div2", ids=a[:1000] + random_prompt(200, seed=1107), max_new_tokens=8)],
    }  # fmt: skip
    mixov = pair[0]
    hits = mixov.kv.counters["radix_hit_tokens"]
    got, mixed_steps = run_both(pair, schedule)
    assert got.tokens["c"] == c_out
    later = [kw for at in (12, 45, 75) for kw in schedule[at]]
    assert_as_cold(cold, got, later)
    cached = got.cached
    assert all(cached[r] == 0 for r in ("bg", "a", "b", "c")), cached
    assert WINDOW < cached["b_twin"] < 1300, cached
    assert 1000 - INTERVAL < cached["a_div"] <= 1000, cached  # the deepest checkpoint before the divergence
    assert 777 - INTERVAL < cached["b_branch"] <= 777, cached
    assert cached["b_rep"] == 1499, cached  # a repeat resumes at len - 1
    turn_end = len(c) + len(c_out) - 1  # overlapped, the step after c finished also fed its last token
    assert cached["c_turn"] in (turn_end, turn_end + 1), cached
    assert cached["a_div2"] == 1000, cached  # a_div checkpointed its divergence point
    assert mixov.kv.counters["radix_hit_tokens"] - hits == sum(cached.values())

    def snapshotted_inside_a_mixed_chunk(rid: str, at: int) -> bool:
        return any(r == rid and crosses(start, n, at) for m in mixed_steps for r, start, n in m.chunks)

    # Those resume points were snapshots taken inside chunks of overlapped mixed steps (not chunk ends).
    assert snapshotted_inside_a_mixed_chunk("b", cached["b_branch"])  # the interval grid
    assert snapshotted_inside_a_mixed_chunk("b", cached["b_twin"])
    assert snapshotted_inside_a_mixed_chunk("a_div", 1000)  # the divergence point
    # The later waves' gaps were prefilled while bg decoded, in overlapped mixed steps.
    assert {r for m in mixed_steps for r, _, _ in m.chunks} >= {kw["rid"] for kw in later}
    assert all("bg" in m.riders for m in mixed_steps if any(r == "a_div2" for r, _, _ in m.chunks))


def test_retraction_during_mixed_overlapped_steps(w512_path, tmp_path_factory, cold):
    """A KV pool a little short of three requests' prompts and outputs: decode retracts the one with
    the least progress (m2) between overlapped mixed steps; its work stays cached, the running
    requests take from that path's tail only what they need, and m2 resumes past the window from
    it (re-prefilled in a mixed step); a later arrival waits behind it. Outputs equal the
    synchronous plain run's and the cold runs', and the pools return to idle."""
    schedule = {
        0: [dict(rid="m0", ids=random_prompt(700, seed=1200), max_new_tokens=45)],
        1: [dict(rid="m1", ids=random_prompt(650, seed=1201), max_new_tokens=60)],
        3: [dict(rid="m2", ids=random_prompt(900, seed=1202), max_new_tokens=60)],
        40: [dict(rid="m3", ids=random_prompt(300, seed=1203), max_new_tokens=20)],
    }  # fmt: skip
    small = [make_scheduler(w512_path, tmp_path_factory, True, chunk=CHUNK, max_total_tokens=2330),
             make_scheduler(w512_path, tmp_path_factory, False, chunk=CHUNK, max_total_tokens=2330,
                            disable_overlap_schedule=True)]  # fmt: skip
    mixov = small[0]
    retractions, resumed = [], {}  # overlapped mixed steps so far at each retraction; where m2 resumed
    real_retract, real_admit = mixov.retract_one, mixov.kv.admit

    def admit(req):
        ok = real_admit(req)
        if ok and req.num_retractions:
            resumed[req.rid] = req.kv_len  # (the last attempt is the one that ran)
        return ok

    mixov.retract_one = lambda: retractions.append(mixov.decode_steps["overlap_mixed_steps"]) or real_retract()
    mixov.kv.admit = admit
    try:
        got, mixed_steps = run_both(small, schedule)
        assert small[0].num_retracted == 1 and small[1].num_retracted == 1
        total = mixov.decode_steps["overlap_mixed_steps"]
        assert any(0 < n < total for n in retractions), (retractions, total)  # between overlapped mixed steps
        assert set(resumed) == {"m2"} and resumed["m2"] > WINDOW, resumed  # from its own cached work
        assert any(r == "m2" and start == resumed["m2"] for m in mixed_steps for r, start, _ in m.chunks)
        assert_as_cold(cold, got, [kw for kws in schedule.values() for kw in kws])
    finally:
        del mixov.retract_one, mixov.kv.admit
        for s in small:
            close_scheduler(s)
