"""MTP speculative decoding under `--tp-size 2`: greedy output equals a plain TP 1 server without MTP,
token for token (batched with retraction, and batch 1 with the radix cache), drafts really are
accepted, constrained requests stay valid, sampled requests keep the two ranks in lockstep, and every
pool returns to its idle baseline.

Both ranks must take the same acceptance decisions or their next forwards no longer pair up: rank
0's answer would mix partial sums of different tokens. `tp_ranks_agree` in /get_server_info compares
a digest of every token each rank emitted.
"""

from __future__ import annotations

import pytest

from test.unit.helpers import random_prompt

from .mtp_common import check_schema_requests, draftable_server, run


@pytest.fixture(scope="module")
def ref(draftable):
    s = draftable_server(draftable)  # TP 1, no MTP
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tp2_mtp(draftable):
    # 300 KV tokens: the first batch below fits at admission but needs ~390 by its end, so a request
    # is retracted and resumed.
    s = draftable_server(
        draftable, "--tp-size", "2", "--speculative-algorithm", "MTP", "--speculative-num-steps", "4",
        "--max-total-tokens", "300",
    )  # fmt: skip
    yield s
    s.stop()


def greedy(ids: list[int], n: int, **extra) -> dict:
    return {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True, **extra}}


def test_greedy_equals_tp1_without_mtp(ref, tp2_mtp):
    # Batched: prompt lengths cross the 16-token window and the 64-token chunk.
    batch = [greedy(random_prompt(20 + 13 * i, seed=700 + i), 32) for i in range(5)]
    want = [r["output_ids"] for r in run(ref, batch)]
    got = run(tp2_mtp, batch)
    assert [g["output_ids"] for g in got] == want
    # Batch 1, then a continuation that resumes every depth from the cached prefix on both ranks.
    first = greedy(random_prompt(50, seed=710), 20)
    a = tp2_mtp.generate(**first)
    assert a["output_ids"] == ref.generate(**first)["output_ids"]
    turn2 = greedy(first["input_ids"] + a["output_ids"] + random_prompt(9, seed=711), 20)
    b = tp2_mtp.generate(**turn2)
    assert b["meta_info"]["cached_tokens"] >= len(first["input_ids"]) + 19
    assert b["output_ids"] == ref.generate(**turn2)["output_ids"]

    metas = [g["meta_info"] for g in [*got, a, b]]
    accepted = sum(m["spec_accepted_drafts"] for m in metas)
    steps = sum(m["spec_verify_ct"] for m in metas)
    assert 0 < accepted < 4 * steps, "the workload must both accept and reject drafts"
    st = tp2_mtp.internal_state()
    assert (st["tp_size"], st["speculative_num_steps"]) == (2, 4)
    assert st["avg_spec_accept_length"] > 1.0
    assert st["num_retracted_reqs"] > 0, "300 KV tokens were meant to force a retraction"
    assert st["tp_ranks_agree"]
    tp2_mtp.wait_idle_baseline()


def test_json_schema_under_tp2_mtp(ref, tp2_mtp):
    check_schema_requests(ref, tp2_mtp, n=2, prompt_len=12, seed=720, new_tokens=120)
    assert tp2_mtp.internal_state()["tp_ranks_agree"]
    tp2_mtp.wait_idle_baseline()



def test_sampled_acceptance_keeps_ranks_in_lockstep(tp2_mtp):
    """Rejection sampling draws random numbers: both ranks must draw the same ones."""
    reqs = [
        {"input_ids": random_prompt(20 + 9 * i, seed=730 + i),
         "sampling_params": {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 12, "ignore_eos": True}}
        for i in range(3)
    ]  # fmt: skip
    before = tp2_mtp.internal_state()["spec_verify_steps"]
    got = run(tp2_mtp, reqs)
    assert all(g["meta_info"]["completion_tokens"] == 12 for g in got)
    st = tp2_mtp.internal_state()
    assert st["spec_verify_steps"] > before
    assert st["tp_ranks_agree"], "the ranks emitted different tokens"
    # A continuation afterwards matches the same prefix in both ranks' radix trees.
    tp2_mtp.generate(**greedy(reqs[0]["input_ids"] + got[0]["output_ids"], 6))
    assert tp2_mtp.internal_state()["tp_ranks_agree"]
    tp2_mtp.wait_idle_baseline()
