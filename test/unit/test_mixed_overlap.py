"""Mixed chunked prefill WITH overlap scheduling (issue 20 item 3), in-process on inkling-tiny: a step
that prefills a chunk and decodes one token of every running request is overlapped (the riders'
tokens come from the pending step on the device; its sampling is the next pending step).

The reference is an independent path: the same arrivals on a scheduler with neither mixing nor
overlap (--no-enable-mixed-chunk --disable-overlap-schedule). Tokens must be equal, fp32 logprobs
within 1e-5; finishes just before a mixed step are also checked against the unstopped greedy run;
every run must have taken overlapped mixed steps (so a silent fallback fails), and the pools (KV,
SWA, request rows and their conv state, checkpoints) end at their idle baseline."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest

from sgl_inkling.chat.tokenizer import get_tokenizer
from sgl_inkling.constrained.request_grammar import native_grammar
from sgl_inkling.managers.scheduler import Scheduler
from sgl_inkling.sampling.sampling_params import SamplingParams

from .helpers import close_scheduler, random_prompt
from .test_mixed_chunk import Recorder, make_scheduler, submit, workload
from .test_overlap_schedule import assert_idle_baseline


@pytest.fixture(scope="module")
def pair(tiny_path, tmp_path_factory):
    """(mixed + overlapped, plain + synchronous) schedulers with the prefix cache on."""
    s = [make_scheduler(tiny_path, tmp_path_factory, True),
         make_scheduler(tiny_path, tmp_path_factory, False, disable_overlap_schedule=True)]  # fmt: skip
    assert s[0].overlap and s[0].mixed_chunk and not s[1].overlap and not s[1].mixed_chunk
    yield s
    for x in s:
        close_scheduler(x)


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


class MixedStep(NamedTuple):
    riders: dict[str, int]  # rid: its KV length before the step (the position of its decode token)
    finished: set[str]  # riders that finished in it (their last token committed while it ran)
    chunks: list[tuple[str, int, int]]  # the prefill chunks it carried: (rid, first position, tokens)


def drive(s: Scheduler, schedule: dict[int, list], abort_at: dict[int, list[str]] | None = None):
    """Submit schedule[i] (submit() kwargs) before step i, then abort abort_at[i] (each must have a
    token in flight when mixed and overlapped); run until idle. Returns the recorder and the mixed
    steps (MixedStep)."""
    rec, i, mixed_steps = Recorder(s), 0, []
    real = s.forward_extend

    def forward_extend(batch, riders=()):
        lens = {r.rid: r.kv_len for r, _, _ in riders}
        chunks = [(r.rid, r.kv_len, n) for r, n, _ in batch]
        real(batch, riders)
        if riders:
            mixed_steps.append(MixedStep(lens, {r.rid for r, _, _ in riders if r.finished}, chunks))

    s.forward_extend = forward_extend
    try:
        while i <= max(schedule) or rec.busy():
            for kw in schedule.get(i, []):
                submit(s, **kw)
            for rid in (abort_at or {}).get(i, []):
                req = next(r for r in [*s.waiting, *s.running, *s.partial] if r.rid == rid)
                if s.overlap:
                    assert s.pending is not None and req in s.pending.reqs, f"{rid} has no token in flight"
                s.abort(rid)
                rec.reasons[rid] = req.finished_reason
            rec.step()
            i += 1
            assert i < 2000, "did not finish"
    finally:
        del s.forward_extend
    assert s.pending is None
    assert_idle_baseline(s)  # and flushes the prefix cache: the next run starts cold
    return rec, mixed_steps


def assert_same_logprobs(got: Recorder, want: Recorder, rid: str, cut: bool = False) -> None:
    """rid's logprobs in got are want's: output and top-k tokens equal, prompt logprob tokens equal,
    fp32 values within 1e-5. cut: want's output lists only as far as got's go (an aborted request:
    the reference may have decoded more)."""
    mine, tops = got.lps.get(rid, []), got.tops.get(rid, [])
    lps, want_tops = want.lps.get(rid, []), want.tops.get(rid, [])
    if cut:
        lps, want_tops = lps[: len(mine)], want_tops[: len(tops)]
    assert [t for _, t in mine] == [t for _, t in lps], rid
    assert [v for v, _ in mine] == pytest.approx([v for v, _ in lps], abs=1e-5), rid
    assert [[t for _, t in row] for row in tops] == [[t for _, t in row] for row in want_tops], rid
    if rid in want.inputs:
        a, b = got.inputs[rid], want.inputs[rid]
        assert [t for _, t in a] == [t for _, t in b], rid
        values = [[v for v, _ in x if v is not None] for x in (a, b)]  # (None: the first prompt token)
        assert values[0] == pytest.approx(values[1], abs=1e-5), rid


def run_both(pair, schedule, abort_at=None):
    """The schedule on both schedulers; outputs agree; the mixed run overlapped mixed steps."""
    mixov, ref = pair
    before = dict(mixov.decode_steps), dict(mixov.mixed_counts)
    got, mixed_steps = drive(mixov, schedule, abort_at)
    want, _ = drive(ref, schedule, abort_at)
    aborted = {rid for rids in (abort_at or {}).values() for rid in rids}
    for rid in aborted:  # overlapped, the token in flight at the abort is discarded
        mine, theirs = got.tokens.get(rid, []), want.tokens.get(rid, [])
        assert mine == theirs[: len(mine)], rid  # (the reference may have decoded fewer: it never mixes)
        want.tokens.pop(rid, None)
        got.tokens.pop(rid, None)
    assert got.tokens == want.tokens
    assert got.reasons == want.reasons
    for rid in {*want.lps, *want.tops, *want.inputs}:
        assert_same_logprobs(got, want, rid, cut=rid in aborted)
    mixed = mixov.mixed_counts["num_mixed_steps"] - before[1]["num_mixed_steps"]
    overlapped = mixov.decode_steps["overlap_mixed_steps"] - before[0]["overlap_mixed_steps"]
    assert mixed > 0 and overlapped == mixed  # every mixed step ran overlapped: no silent fallback
    assert mixov.decode_steps["overlap_decode_steps"] > before[0]["overlap_decode_steps"]
    return got, mixed_steps


def test_mixed_overlapped_outputs_equal_the_synchronous_plain_path(pair, tok):
    """Arrivals while others decode (multi-chunk prompts, prefix hits, prompt/top logprobs, seeded
    sampling, a regex and a json_schema grammar riding along)."""
    schedule = workload()
    schema = '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}'
    prompt = random_prompt(25, seed=8)
    grammar = native_grammar(tok, SamplingParams(json_schema=schema), prompt)
    schedule.setdefault(4, []).append(dict(rid="json", ids=prompt, grammar=grammar, max_new_tokens=40, ignore_eos=False,
                            logprobs={"return_logprob": True}))  # fmt: skip
    got, mixed_steps = run_both(pair, schedule)
    assert set(got.tokens) == {"short", "base", "long", "seeded", "regex", "hit", "again", "json"}
    assert {"json", "seeded", "long"} <= set().union(*(m.riders for m in mixed_steps))  # they rode along
    assert len(got.inputs["long"]) == 330 and len(got.tops["long"]) == 12
    if got.reasons["json"]["type"] == "stop":
        assert json.loads(tok.decode(got.tokens["json"], skip_special_tokens=True))["ok"] in (True, False)


def test_finishes_just_before_a_mixed_step(pair, tok):
    """A request whose last token (max_new_tokens, a stop token, a stop string) is sampled at step n
    rides in the mixed step n + 1 (a prompt arrives before it): it consumes that token there, samples
    nothing, and its output is the unstopped greedy run's, cut where the condition holds."""
    mixov, ref = pair
    prompts = {k: random_prompt(10 + i, seed=80 + i) for i, k in enumerate(("len", "tok", "str", "bg"))}
    greedy, _ = drive(ref, {0: [dict(rid=k, ids=p, max_new_tokens=10) for k, p in prompts.items()]})
    g = greedy.tokens
    stop_tok = g["tok"][4]
    tok_at = g["tok"].index(stop_tok) + 1
    text = tok.decode(g["str"][4:6])
    # Brute force: the first prefix whose decoded tail (as the scheduler decodes it) holds the string.
    str_at = next(k for k in range(1, 11) if text in tok.decode(g["str"][:k][-(len(text) + 8) :]))
    # All four prefill at step 0 (their first token) and then decode one token per step: the k-th
    # token is sampled at step k - 1, so a prompt arriving before step k mixes into the next step.
    schedule = {0: [dict(rid="len", ids=prompts["len"], max_new_tokens=5),
                    dict(rid="tok", ids=prompts["tok"], max_new_tokens=10, stop_token_ids=[stop_tok]),
                    dict(rid="str", ids=prompts["str"], max_new_tokens=10, stop=[text]),
                    dict(rid="bg", ids=prompts["bg"], max_new_tokens=14)]}  # fmt: skip
    for at in {5, tok_at, str_at}:
        schedule.setdefault(at, []).append(dict(rid=f"late{at}", ids=random_prompt(20, seed=90 + at), max_new_tokens=3))
    got, mixed_steps = run_both(pair, schedule)
    assert got.tokens["len"] == g["len"][:5]
    assert got.tokens["tok"] == g["tok"][:tok_at] and got.reasons["tok"]["matched"] == stop_tok
    assert got.tokens["str"] == g["str"][:str_at] and got.reasons["str"]["matched"] == text
    assert got.tokens["bg"][:10] == g["bg"] and len(got.tokens["bg"]) == 14
    finished_riding = set().union(*(m.finished for m in mixed_steps))
    assert {"len", "tok", "str"} <= finished_riding  # each finished while riding in a mixed step


def test_aborts_while_tokens_are_in_flight(pair):
    """Aborted right before a mixed step, while the pending step holds its token: a rider, and a
    request whose first token the previous (mixed) step queued; the others are unaffected."""
    schedule = {
        0: [dict(rid="keep", ids=random_prompt(30, seed=60), max_new_tokens=16),
            dict(rid="rider", ids=random_prompt(20, seed=61), max_new_tokens=30)],
        3: [dict(rid="fresh", ids=random_prompt(25, seed=62), max_new_tokens=20)],
        4: [dict(rid="late", ids=random_prompt(150, seed=63), max_new_tokens=6)],
    }  # fmt: skip
    got, _ = run_both(pair, schedule, abort_at={4: ["rider", "fresh"]})
    assert got.reasons["rider"]["type"] == "abort" and got.reasons["fresh"]["type"] == "abort"
    assert len(got.tokens["keep"]) == 16 and len(got.tokens["late"]) == 6 and "fresh" not in got.tokens


N_RETRACT = 20


def test_retraction_under_a_tiny_kv_pool(tiny_path, tmp_path_factory):
    """Memory pressure: admission holds back, decode retracts (committing the pending step first);
    outputs equal the synchronous plain run's and both ran out of memory."""
    schedule = {0: [dict(rid="q0", ids=random_prompt(30, seed=40), max_new_tokens=N_RETRACT)],
                2: [dict(rid=f"q{i}", ids=random_prompt(30 + 10 * i, seed=40 + i), max_new_tokens=N_RETRACT)
                    for i in (1, 2)]}  # fmt: skip
    small = [make_scheduler(tiny_path, tmp_path_factory, True, max_total_tokens=100),
             make_scheduler(tiny_path, tmp_path_factory, False, max_total_tokens=100,
                            disable_overlap_schedule=True)]  # fmt: skip
    try:
        got, _ = run_both(small, schedule)
        assert small[0].num_retracted > 0 and small[1].num_retracted > 0
        assert small[0].decode_steps["sync_decode_steps"] > 0  # the overlapped run fell back to retract
        assert all(len(v) == N_RETRACT for v in got.tokens.values())
    finally:
        for s in small:
            close_scheduler(s)
