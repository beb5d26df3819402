"""MTP speculative decoding over HTTP: greedy output equals the non-speculative server's, token for
token, with the radix cache, chunked prefill, grammars, aborts and retraction.

The checkpoint is inkling-tiny-draftable (drafts are right often enough to accept several per step,
wrong often enough to reject): the reference is the same checkpoint served without MTP.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from test.unit.helpers import random_prompt

from .mtp_common import SCHEMA, check_schema_requests, draftable_server, run

CHAT = ("--tool-call-parser", "inkling", "--reasoning-parser", "inkling")  # chat with tools


@pytest.fixture(scope="module")
def ref(draftable):
    s = draftable_server(draftable, *CHAT)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mtp(draftable):
    s = draftable_server(draftable, "--speculative-algorithm", "MTP", *CHAT)  # all 8 depths, radix cache on
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mtp_small(draftable):
    # EAGLE is SGLang's name for the same thing; 3 depths; no prefix cache; 500 KV tokens force retraction.
    s = draftable_server(
        draftable, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--disable-radix-cache", "--max-total-tokens", "500",
    )  # fmt: skip
    yield s
    s.stop()


def bodies(n: int, new_tokens: int = 40) -> list[dict]:
    # Prompt lengths cross the 64-token chunk and the 16-token window.
    return [
        {
            "input_ids": random_prompt(3 + (29 * i) % 150, seed=500 + i),
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True},
        }
        for i in range(n)
    ]


def test_greedy_equals_non_speculative_batched(ref, mtp):
    reqs = bodies(12)
    want = [r["output_ids"] for r in run(ref, reqs)]
    got = run(mtp, reqs)
    assert [r["output_ids"] for r in got] == want
    metas = [r["meta_info"] for r in got]
    steps = sum(m["spec_verify_ct"] for m in metas)
    accepted = sum(m["spec_accepted_drafts"] for m in metas)
    assert accepted > 0 and accepted < 8 * steps, "the workload must both accept and reject drafts"
    assert all(m["completion_tokens"] == 40 for m in metas)
    # The prefill emits the first token; each verify step its accepted drafts plus one (the last step
    # may be cut by the length).
    assert all(1 + m["spec_verify_ct"] + m["spec_accepted_drafts"] >= 40 for m in metas)
    info = mtp.internal_state()
    assert info["speculative_num_steps"] == 8
    assert info["avg_spec_accept_length"] > 1.5
    # Adaptive by default: per-depth acceptance measured, the drafts per step chosen from it.
    assert info["speculative_adaptive"] and len(info["spec_accept_rate_by_depth"]) == 8
    assert 0 < info["spec_accept_rate_by_depth"][0] < 1 and info["spec_verified_drafts_by_depth"][0] > 0
    assert sum(info["spec_draft_steps_by_k"]) > 0
    mtp.wait_idle_baseline()


def test_greedy_batch_1_and_prefix_cache_continuations(ref, mtp):
    """A multi-turn continuation resumes every depth from the cached prefix (checkpoint + carry)."""
    first = bodies(1, 30)[0]
    a = mtp.generate(**first)
    assert a["output_ids"] == ref.generate(**first)["output_ids"]
    turn2 = {
        "input_ids": first["input_ids"] + a["output_ids"] + random_prompt(20, seed=77),
        "sampling_params": {"temperature": 0, "max_new_tokens": 30, "ignore_eos": True},
    }
    b = mtp.generate(**turn2)
    assert b["meta_info"]["cached_tokens"] >= len(first["input_ids"]) + 29
    assert b["output_ids"] == ref.generate(**turn2)["output_ids"]
    # Two requests that share a long prefix and then diverge.
    shared = random_prompt(90, seed=78)
    forks = [
        {"input_ids": shared + random_prompt(7, seed=80 + i),
         "sampling_params": {"temperature": 0, "max_new_tokens": 25, "ignore_eos": True}}
        for i in range(3)
    ]  # fmt: skip
    want = [ref.generate(**f)["output_ids"] for f in forks]
    got = [mtp.generate(**f) for f in forks]
    assert [g["output_ids"] for g in got] == want
    assert got[2]["meta_info"]["cached_tokens"] >= 64
    mtp.wait_idle_baseline()


def test_retraction_and_no_radix_cache(ref, mtp_small):
    reqs = bodies(10, 45)
    want = [r["output_ids"] for r in run(ref, reqs)]
    assert [r["output_ids"] for r in run(mtp_small, reqs)] == want
    st = mtp_small.wait_idle_baseline()
    assert st["num_retracted_reqs"] > 0, "500 KV tokens were meant to force retraction"
    assert st["speculative_num_steps"] == 3


def test_json_schema_drafts_are_masked(ref, mtp):
    check_schema_requests(ref, mtp, n=4, prompt_len=10, seed=900, new_tokens=150)
    mtp.wait_idle_baseline()


def test_json_schema_logprobs_equal_the_plain_paths(ref, mtp):
    """Logprobs of a grammar-constrained request are taken after the grammar mask with MTP as
    without it (the plain path's convention), top logprobs included."""
    body = {
        "input_ids": random_prompt(14, seed=905),
        "sampling_params": {"temperature": 0, "max_new_tokens": 60, "json_schema": json.dumps(SCHEMA)},
        "return_logprob": True,
        "top_logprobs_num": 3,
    }
    want, got = ref.generate(**body), mtp.generate(**body)
    assert got["output_ids"] == want["output_ids"]
    assert got["meta_info"]["spec_accepted_drafts"] > 0
    w, g = want["meta_info"], got["meta_info"]
    assert [t for _, t, _ in g["output_token_logprobs"]] == got["output_ids"]
    for (lw, _, _), (lg, _, _) in zip(w["output_token_logprobs"], g["output_token_logprobs"], strict=True):
        assert lg == pytest.approx(lw, abs=1e-4)
    for tw, tg in zip(w["output_top_logprobs"], g["output_top_logprobs"], strict=True):
        assert [t for _, t, _ in tg] == [t for _, t, _ in tw]
        assert [v for v, _, _ in tg] == pytest.approx([v for v, _, _ in tw], abs=1e-4)
    # After the mask, a position where the grammar allows one token has probability 1.
    assert max(lp for lp, _, _ in g["output_token_logprobs"]) > -1e-4
    mtp.wait_idle_baseline()


def test_tool_calls_equal_the_plain_paths(ref, mtp):
    """Chat with tools (the TMLv0 tool grammar constrains drafts and verify rows): the same calls."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 6}, "n": {"type": "integer",
        "minimum": 0, "maximum": 99}}, "required": ["q", "n"]}}} for n in ("find", "count")]  # fmt: skip
    bodies = [
        {"messages": [{"role": "user", "content": f"look up item {i}"}], "tools": tools,
         "tool_choice": "required", "temperature": 0, "max_tokens": 80, "reasoning_effort": "none"}
        for i in range(3)
    ]  # fmt: skip

    def calls(server) -> list:
        out, model = [], server.get("/v1/models").json()["data"][0]["id"]
        for b in bodies:
            r = server.post("/v1/chat/completions", {**b, "model": model})
            assert r.status_code == 200, r.text
            c = r.json()["choices"][0]
            out.append((c["finish_reason"], [(t["function"]["name"], t["function"]["arguments"])
                                             for t in c["message"].get("tool_calls") or []]))  # fmt: skip
        return out

    want = calls(ref)
    assert all(f == "tool_calls" and len(tc) == 1 for f, tc in want), want
    assert calls(mtp) == want
    mtp.wait_idle_baseline()



def test_abort_mid_stream_returns_every_slot(mtp):
    body = {
        "input_ids": random_prompt(40, seed=5),
        "sampling_params": {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True},
        "stream": True,
        "rid": "mtp-abort-me",
    }
    seen = []

    def consume():
        with mtp.post("/generate", body, stream=True) as r:
            for line in r.iter_lines():
                if line:
                    seen.append(line)

    t = threading.Thread(target=consume)
    t.start()
    deadline = time.time() + 60
    while len(seen) < 3 and time.time() < deadline:
        time.sleep(0.05)
    assert mtp.post("/abort_request", {"rid": "mtp-abort-me"}).status_code == 200
    t.join(60)
    assert not t.is_alive()
    mtp.wait_idle_baseline()
