"""A chunked prefill short of memory (scheduler_prefill.py, _chunk_that_fits) on inkling-tiny-w512
(sliding window 512, chunks of 192), in float32 on the CPU: the next chunk shrinks to the memory
left, counting what the radix cache can evict, down to MIN_CHUNK_TOKENS (SGLang shrinks it to what
is free, in pages: ours are single tokens). A partially prefilled request holds its memory; it used
to wait for a whole chunk's worth until decode ran dry and retracted (40 steps at 760 of 900
tokens in the workload below). The pool (1400 tokens) is short of the three requests together, so
the scheduler must still retract when nothing fits; outputs equal a cold run of each request and
the pools return to idle (drive() checks it)."""

from __future__ import annotations

import pytest

from sgl_inkling.managers.scheduler_prefill import MIN_CHUNK_TOKENS

from .helpers import close_scheduler, random_prompt
from .test_mixed_chunk import cold_scheduler, make_scheduler
from .test_mixed_overlap import assert_same_logprobs, drive

CHUNK = 192
SCHEDULE = {
    0: [dict(rid="r0", ids=random_prompt(300, seed=1), max_new_tokens=60),
        dict(rid="r1", ids=random_prompt(250, seed=2), max_new_tokens=60)],
    3: [dict(rid="p", ids=random_prompt(900, seed=3), max_new_tokens=5,
             logprobs={"return_logprob": True, "top_logprobs_num": 2})],
}  # fmt: skip
# Decode takes at least one slot per running request (two here) each step, so once less than a
# minimum chunk (plus each one's reserved decode and rider slot) is left, it runs dry within this
# many steps and retracts.
MAX_STALL = (MIN_CHUNK_TOKENS + 2 * 2) // 2 + 2


@pytest.fixture(scope="module")
def w512_path():
    from sgl_inkling.models.inkling.tiny_window import ensure_tiny_window_checkpoint

    return str(ensure_tiny_window_checkpoint())


@pytest.fixture(scope="module")
def cold(w512_path, tmp_path_factory):
    """Each request run alone: no prefix cache, its prompt prefilled in one forward, synchronous."""
    with cold_scheduler(w512_path, tmp_path_factory) as s:
        yield {k["rid"]: drive(s, {0: [k]})[0] for kws in SCHEDULE.values() for k in kws}


def room(s) -> int:
    """KV slots a chunk could get: free ones plus what the radix cache holds unlocked (evictable)."""
    full, swa = s.kv.full.available, s.kv.swa.available
    if s.kv.radix is not None:
        stack = list(s.kv.radix.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.lock_ref == 0:
                full += len(node.key)
                swa += int((node.swa != 0).sum())
    return min(full, swa)


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed-overlap", "plain-sync"])
def test_a_partial_prefill_short_of_memory_progresses_on_what_is_left(w512_path, tmp_path_factory, cold, mixed):
    """While a minimum chunk fits beside decode's reserve, the partial prefill at the head progresses
    every step; below that it waits at most MAX_STALL steps (decode uses the rest up and retracts)."""
    kw = dict(max_total_tokens=1400) if mixed else dict(max_total_tokens=1400, disable_overlap_schedule=True)
    s = make_scheduler(w512_path, tmp_path_factory, mixed, chunk=CHUNK, **kw)
    steps = []  # per step with a partial prefill: (room, running, rest of its prompt, its progress)
    real = s.run_prefill

    def run_prefill():
        head = s.partial[0] if s.partial else None
        if head is None:
            return real()
        at, free, running, rest = head.kv_len, room(s), len(s.running), len(head.fill_ids) - head.kv_len
        ran = real()
        if head.row is not None:
            progress = head.kv_len - at
        else:  # freed: it finished (a resumed request's last token), or it failed
            progress = rest if head.finished and head.finished_reason["type"] == "length" else 0
        steps.append((free, running, rest, progress))
        return ran

    s.run_prefill = run_prefill
    try:
        got, _ = drive(s, SCHEDULE)
        assert steps and s.num_retracted >= 1  # the pool is short: it retracted, it did not spin
        for free, running, rest, progress in steps:
            if free >= MIN_CHUNK_TOKENS + 2 * running:  # a minimum chunk fits beside decode's reserve
                assert progress >= min(rest, MIN_CHUNK_TOKENS), str(steps)
        # Some chunk was shrunk to the memory left (neither a whole chunk nor the prompt's rest).
        assert any(0 < p < min(rest, CHUNK - running) for _, running, rest, p in steps), steps
        stall = longest = 0
        for *_, progress in steps:
            stall = stall + 1 if progress == 0 else 0
            longest = max(longest, stall)
        assert longest <= MAX_STALL, steps
        for rid, want in cold.items():
            assert got.tokens[rid] == want.tokens[rid], rid
            assert got.reasons[rid] == want.reasons[rid], rid
            assert_same_logprobs(got, want, rid)
    finally:
        del s.run_prefill
        close_scheduler(s)


LONE = {
    0: [dict(rid="r0", ids=random_prompt(300, seed=4), max_new_tokens=220)],
    3: [dict(rid="p", ids=random_prompt(1100, seed=5), max_new_tokens=4)],
}  # fmt: skip


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed-overlap", "plain-sync"])
def test_a_lone_running_request_short_of_memory_retracts_the_partial_prefill(w512_path, tmp_path_factory, mixed):
    """One request decodes while a long prompt's chunks take the rest of the pool (1400 tokens: the
    two need 1624): when decode runs dry, the partial prefill is put back to wait, not the lone
    running request aborted ('out of KV memory'); both equal cold runs, the pools return to idle."""
    with cold_scheduler(w512_path, tmp_path_factory) as cold:
        want = {k["rid"]: drive(cold, {0: [k]})[0] for kws in LONE.values() for k in kws}
    kw = dict(max_total_tokens=1400) if mixed else dict(max_total_tokens=1400, disable_overlap_schedule=True)
    s = make_scheduler(w512_path, tmp_path_factory, mixed, chunk=CHUNK, **kw)
    try:
        got, _ = drive(s, LONE)
        assert s.num_retracted >= 1  # the partial went back to wait
        for rid, ref in want.items():
            assert got.reasons[rid] == ref.reasons[rid], rid
            assert got.tokens[rid] == ref.tokens[rid], rid
    finally:
        close_scheduler(s)
