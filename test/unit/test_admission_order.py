"""Admission order (schedule_policy.py, scheduler_prefill.py): head-of-line admission by memory, and
lpm's cache-friendly reordering limited to requests that have waited less than MAX_WAIT_S."""

from __future__ import annotations

import time

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.managers.schedule_policy import LPM_MIN_QUEUE, MAX_WAIT_S, SchedulePolicy

from .helpers import close_scheduler, random_prompt
from .test_mixed_chunk import idle, make_scheduler, submit


def test_a_long_prompt_that_must_wait_is_not_overtaken_by_short_ones(tiny_path, tmp_path_factory):
    """Head-of-line admission: while the long prompt waits for memory, short prompts arriving after it
    (each of which would fit) wait behind it; it is admitted first once memory comes back."""
    s = make_scheduler(tiny_path, tmp_path_factory, True, max_total_tokens=360, disable_radix_cache=True)
    try:
        submit(s, "run", random_prompt(300, seed=80), max_new_tokens=40)
        while not s.running:
            s.step()
        submit(s, "long", random_prompt(300, seed=81), max_new_tokens=2)  # not even a chunk fits now
        admitted, step = {}, 0
        while s.waiting or s.partial or s.running:
            if step < 40:
                submit(s, f"s{step}", random_prompt(10, seed=200 + step), max_new_tokens=2)
            s.step()
            step += 1
            for r in [*s.running, *s.partial, *s.outbox]:
                admitted.setdefault(r.rid, step)
            s.outbox.clear()
        assert admitted["long"] > 5  # it did have to wait for memory
        assert all(admitted[f"s{i}"] >= admitted["long"] for i in range(40))
        assert idle(s)
    finally:
        close_scheduler(s)


def test_lpm_reorders_only_requests_that_have_not_waited_too_long():
    class Hits:  # cached prefix = the first token's value (a stand-in for the radix tree)
        def peek(self, key):
            return key[0]

    reqs = [Req(rid=f"r{i}", origin_input_ids=[i], sampling_params=None, stop_token_ids=set())
            for i in range(LPM_MIN_QUEUE + 2)]  # fmt: skip
    policy = SchedulePolicy("lpm", Hits())
    assert [r.rid for r in policy.order(reqs)] == [f"r{i}" for i in reversed(range(len(reqs)))]
    reqs[0].arrival = reqs[1].arrival = time.monotonic() - MAX_WAIT_S - 1  # overdue: first, in arrival order
    assert [r.rid for r in policy.order(reqs)][:3] == ["r0", "r1", f"r{len(reqs) - 1}"]
    assert [r.rid for r in policy.order(reqs[:LPM_MIN_QUEUE - 1])] == [r.rid for r in reqs[:LPM_MIN_QUEUE - 1]]
