"""Mixed chunked prefill (issue 20 item 3), in-process: a step that prefills a chunk also decodes one
token of every running request. The reference is the same scheduler with --no-enable-mixed-chunk
driven with the same arrivals: tokens, fp32 logprobs (output, top and prompt) must be equal exactly,
through radix prefix hits, grammars, seeded sampling, retraction and aborts; the pools end idle."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch

from sgl_inkling.constrained import GrammarSpec, formats
from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.managers.scheduler import Scheduler
from sgl_inkling.sampling.sampling_params import SamplingParams
from sgl_inkling.server_args import ServerArgs, ServerArgsError, parse_server_args

from .helpers import close_scheduler, new_scheduler, random_prompt

CHUNK = 64  # tokens per step: prompts of a few hundred tokens take several chunks


def make_scheduler(tiny_path, tmp_path_factory, mixed: bool, chunk: int = CHUNK, **kw) -> Scheduler:
    args = ServerArgs(model_path=str(tiny_path), chunked_prefill_size=chunk,
                      max_prefill_tokens=chunk, enable_mixed_chunk=mixed, **{"device": "cpu", **kw})  # fmt: skip
    return new_scheduler(args, tmp_path_factory)


@contextlib.contextmanager
def cold_scheduler(path, tmp_path_factory, chunk: int = 2048):
    """The reference for runs under test: no prefix cache, no overlap, each prompt (up to `chunk`
    tokens) prefilled in one forward; drive it one request at a time for a cold run of each."""
    s = make_scheduler(path, tmp_path_factory, False, chunk=chunk, disable_radix_cache=True,
                       disable_overlap_schedule=True)  # fmt: skip
    try:
        yield s
    finally:
        close_scheduler(s)


@pytest.fixture(scope="module")
def pair(tiny_path, tmp_path_factory):
    """(mixed, plain) schedulers with the prefix cache on."""
    s = [make_scheduler(tiny_path, tmp_path_factory, m) for m in (True, False)]
    yield s
    for x in s:
        close_scheduler(x)


def submit(s: Scheduler, rid: str, ids: list[int], grammar=None, logprobs: dict | None = None, **params) -> None:
    sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, **params})
    s.handle(TokenizedGenerateReq(rid=rid, input_ids=list(ids), sampling_params=sp, grammar=grammar,
                                  **(logprobs or {})))  # fmt: skip


class Recorder:
    """Everything each request sent out, accumulated over the steps."""

    def __init__(self, s: Scheduler):
        self.s, self.tokens, self.lps, self.tops, self.inputs, self.reasons = s, {}, {}, {}, {}, {}
        self.cached: dict[str, int] = {}  # cached_tokens: the prompt tokens its first admission reused

    def step(self) -> None:
        self.s.step()
        for r in dict.fromkeys(self.s.outbox):
            self.tokens.setdefault(r.rid, []).extend(r.new_tokens)
            self.lps.setdefault(r.rid, []).extend(r.new_logprobs)
            self.tops.setdefault(r.rid, []).extend(r.new_top_logprobs)
            if r.input_logprobs is not None:
                self.inputs[r.rid] = list(r.input_logprobs)
            if r.finished_reason is not None:
                self.reasons[r.rid] = r.finished_reason
            self.cached[r.rid] = r.cached_tokens
            r.new_tokens, r.new_logprobs, r.new_top_logprobs = [], [], []
        self.s.outbox.clear()

    def busy(self) -> bool:
        return bool(self.s.waiting or self.s.running or self.s.partial)


def idle(s: Scheduler) -> bool:
    st = s.kv.stats()
    cached = st.get("radix_cached_tokens", 0)
    return (
        st["full_kv_available"] + cached == st["full_kv_total"]
        and st["swa_kv_available"] + st.get("radix_swa_tokens", 0) == st["swa_kv_total"]
        and st["req_slots_available"] == st["req_slots_total"]
    )


def drive(s: Scheduler, schedule: dict[int, list], abort_at: dict[int, list[str]] | None = None) -> Recorder:
    """Submit schedule[i] (submit() kwargs) before step i, abort abort_at[i]; run until idle."""
    rec, i = Recorder(s), 0
    while i <= max(schedule) or rec.busy():
        for kw in schedule.get(i, []):
            submit(s, **kw)
        for rid in (abort_at or {}).get(i, []):
            req = next(r for r in [*s.waiting, *s.running, *s.partial] if r.rid == rid)
            s.abort(rid)  # its output goes straight to the (unread) socket
            rec.reasons[rid] = req.finished_reason
        rec.step()
        i += 1
        assert i < 2000, "did not finish"
    assert idle(s)
    if s.kv.radix is not None:
        s.kv.radix.flush()
    return rec


def workload() -> dict[int, list]:
    base = random_prompt(150, seed=11)
    lp = {"return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0}
    return {
        0: [dict(rid="short", ids=random_prompt(12, seed=1), max_new_tokens=40),
            dict(rid="base", ids=base, max_new_tokens=8)],
        2: [dict(rid="long", ids=random_prompt(330, seed=2), max_new_tokens=12, logprobs=lp)],
        3: [dict(rid="seeded", ids=random_prompt(30, seed=3), max_new_tokens=20, temperature=1.0, sampling_seed=7)],
        5: [dict(rid="regex", ids=random_prompt(20, seed=4), max_new_tokens=16,
                 grammar=GrammarSpec(formats.structural_tag(formats.regex("[a-c]{3,6}x")), "regex"))],
        # A prefix hit on base (cached at its chunk boundaries and its end), with prompt logprobs.
        14: [dict(rid="hit", ids=base + random_prompt(90, seed=5), max_new_tokens=10, logprobs=lp),
             dict(rid="again", ids=base, max_new_tokens=6, logprobs={"return_logprob": True})],
    }  # fmt: skip


def test_mixed_outputs_equal_plain_outputs(pair):
    mixed, plain = (drive(s, workload()) for s in pair)
    assert set(mixed.tokens) == {"short", "base", "long", "seeded", "regex", "hit", "again"}
    assert mixed.tokens == plain.tokens
    assert mixed.lps == plain.lps and mixed.tops == plain.tops and mixed.inputs == plain.inputs
    assert mixed.reasons == plain.reasons
    assert re.fullmatch("[a-c]{3,6}x", pair[0].tokenizer.decode(mixed.tokens["regex"][:-1]))  # then the end
    assert len(mixed.inputs["long"]) == 330 and len(mixed.tops["long"]) == 12
    assert all(len(v) == len(mixed.tokens[k]) for k, v in mixed.lps.items() if k in ("long", "hit", "again"))
    assert pair[0].kv.counters["radix_hit_tokens"] > 0  # the prefix hits happened
    st_mixed, st_plain = pair[0].internal_state(), pair[1].internal_state()
    assert st_mixed["enable_mixed_chunk"] and not st_plain["enable_mixed_chunk"]
    assert st_mixed["num_mixed_steps"] > 0 and st_plain["num_mixed_steps"] == 0


def test_running_requests_decode_while_a_long_prompt_prefills(pair):
    gained = {}
    for s in pair:
        submit(s, "a", random_prompt(10, seed=20), max_new_tokens=200)
        s.step()
        (a,) = s.running
        assert a.output_ids  # a short prompt with nothing waiting reads its first token at once
        submit(s, "b", random_prompt(6 * CHUNK, seed=21), max_new_tokens=2)
        sizes = []
        real = s.runner.forward
        s.runner.forward = lambda fb, sizes=sizes, real=real: sizes.append(len(fb.input_ids)) or real(fb)
        steps = grew = 0
        try:
            while not any(r.rid == "b" and r.output_ids for r in s.running + [x for x in s.outbox]):
                before = len(a.output_ids)
                s.step()
                steps += 1
                grew += len(a.output_ids) > before
        finally:
            s.runner.forward = real
        gained[s.mixed_chunk] = (steps, grew)
        assert max(sizes) <= CHUNK  # decode tokens count against the per-step budget
        s.abort("", abort_all=True)
        s.outbox.clear()
        assert idle(s)
    steps, grew = gained[True]
    # Overlapped, each step commits the token a's previous step queued: a gains a token in every
    # step of b's multi-chunk prefill but the first, and in the step that reads b's first token.
    assert steps >= 6 and grew == steps - 1
    assert gained[False][1] == 0  # without mixing, a waits for all of b's chunks


def test_no_mixing_when_the_running_batch_would_take_most_of_the_budget(tiny_path, tmp_path_factory):
    """Prefill keeps at least half the budget: a big running batch makes steps prefill alone."""
    s = make_scheduler(tiny_path, tmp_path_factory, True, disable_radix_cache=True)
    try:
        for i in range(CHUNK // 2 + 1):
            submit(s, f"r{i}", random_prompt(1, seed=100 + i), max_new_tokens=50)
        while s.waiting:
            s.step()
        assert len(s.running) == CHUNK // 2 + 1
        submit(s, "late", random_prompt(CHUNK, seed=99), max_new_tokens=1)
        s.commit_pending()  # the tokens in flight (overlapped): the running batch as it stands
        before = [len(r.output_ids) for r in s.running]
        overlapped = s.decode_steps["overlap_prefill_steps"]
        s.step()  # the late prompt prefills alone, with the whole budget
        assert [len(r.output_ids) for r in s.running if r.rid != "late"] == before
        # A whole chunk: overlapped, its token read at the next commit (a short one reads it at once).
        assert s.decode_steps["overlap_prefill_steps"] == overlapped + 1
        s.commit_pending()
        assert any(r.rid == "late" for r in s.outbox) and s.mixed_counts["num_mixed_steps"] == 0
        s.abort("", abort_all=True)
        assert idle(s)
    finally:
        close_scheduler(s)


def test_a_short_lone_prefill_overlaps_only_when_requests_wait_behind_it(tiny_path, tmp_path_factory):
    """A short prefill without riders reads its token in its own step (nothing to build meanwhile);
    with requests waiting behind it, it is queued like a decode step and the next step is built while
    it runs (its token read at the next commit)."""
    s = make_scheduler(tiny_path, tmp_path_factory, True, disable_radix_cache=True, max_running_requests=1)
    try:
        assert 2 * 10 < CHUNK  # short: under half the budget
        submit(s, "alone", random_prompt(10, seed=1), max_new_tokens=1)
        overlapped = s.decode_steps["overlap_prefill_steps"]
        s.step()
        assert s.decode_steps["overlap_prefill_steps"] == overlapped
        assert any(r.rid == "alone" and r.finished_reason is not None for r in s.outbox)
        s.outbox.clear()
        for rid in ("first", "behind"):  # one running request at most: "behind" waits
            submit(s, rid, random_prompt(10, seed=2), max_new_tokens=2)
        s.step()
        assert [r.rid for r in s.waiting] == ["behind"]
        assert s.decode_steps["overlap_prefill_steps"] == overlapped + 1
        assert not any(r.rid == "first" for r in s.outbox)  # in flight
        s.commit_pending()
        assert any(r.rid == "first" and r.new_tokens for r in s.outbox)
        s.abort("", abort_all=True)
        assert idle(s)
    finally:
        close_scheduler(s)


def test_retraction_under_a_tiny_kv_budget(tiny_path, tmp_path_factory):
    """Greedy outputs survive retraction (re-prefilled later) in both modes and agree."""
    outs = []
    for mixed in (True, False):
        s = make_scheduler(tiny_path, tmp_path_factory, mixed, max_total_tokens=400)
        try:
            sched = {0: [dict(rid=f"q{i}", ids=random_prompt(60 + 25 * i, seed=40 + i), max_new_tokens=70)
                         for i in range(4)]}  # fmt: skip
            rec = drive(s, sched)
            assert s.num_retracted > 0
            outs.append(rec.tokens)
        finally:
            close_scheduler(s)
    assert outs[0] == outs[1] and all(len(v) == 70 for v in outs[0].values())


def test_aborts_mid_prefill_and_mid_decode(pair):
    sched = {
        0: [dict(rid="keep", ids=random_prompt(40, seed=60), max_new_tokens=30),
            dict(rid="dec", ids=random_prompt(20, seed=61), max_new_tokens=100)],
        2: [dict(rid="pre", ids=random_prompt(5 * CHUNK, seed=62), max_new_tokens=5),
            dict(rid="tail", ids=random_prompt(50, seed=63), max_new_tokens=25)],
    }  # fmt: skip
    recs = [drive(s, sched, abort_at={4: ["pre"], 6: ["dec"]}) for s in pair]
    for rec in recs:
        assert rec.reasons["pre"]["type"] == "abort" and rec.reasons["dec"]["type"] == "abort"
        assert len(rec.tokens["keep"]) == 30 and len(rec.tokens["tail"]) == 25
    assert recs[0].tokens["keep"] == recs[1].tokens["keep"] and recs[0].tokens["tail"] == recs[1].tokens["tail"]


def test_mixed_chunk_flag(monkeypatch):
    plain = parse_server_args(["--device", "cpu"])
    assert plain.enable_mixed_chunk is False and not plain.disable_overlap_schedule  # off by default on cpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # only the defaults are looked at
    cuda = ServerArgs(device="cuda")
    cuda.check()
    assert cuda.enable_mixed_chunk is True  # on by default where it was measured faster
    cuda_mtp = ServerArgs(device="cuda", speculative_algorithm="MTP")
    cuda_mtp.check()
    assert cuda_mtp.enable_mixed_chunk is False
    assert parse_server_args(["--device", "cpu", "--enable-mixed-chunk"]).enable_mixed_chunk is True
    assert parse_server_args(["--device", "cpu", "--no-enable-mixed-chunk"]).enable_mixed_chunk is False
    mtp = ServerArgs(device="cpu", speculative_algorithm="MTP")
    mtp.check()
    assert mtp.enable_mixed_chunk is False  # MTP steps do not mix (refused when asked for)
    with pytest.raises(ServerArgsError, match="--enable-mixed-chunk"):
        ServerArgs(device="cpu", speculative_algorithm="MTP", enable_mixed_chunk=True).check()


def test_a_failed_mixed_step_fails_its_prefill_only(pair, monkeypatch):
    """The forward runs (conv state and KV move) and then raises: the prompt it carried fails, the
    rider gets its state back and its output equals the run without the failure (the rider's token
    pending when the step failed is neither lost nor committed twice)."""
    from sgl_inkling.model_executor.step_faults import ModelStepError

    outs = []
    for fail in (True, False):
        s = pair[0]
        submit(s, "a", random_prompt(30, seed=70), max_new_tokens=12)
        s.step()
        (a,) = s.running
        s.step()  # a decode step: a's token is still pending (on the device) when the mixed step runs
        assert s.pending is not None and s.pending.reqs == [a]
        submit(s, "b", random_prompt(40, seed=71), max_new_tokens=4)
        real, seqs = s.runner.forward, []

        def forward(fb, seqs=seqs, real=real, fail=fail):
            seqs.append(fb.batch_size)
            out = real(fb)
            if fail and len(fb.input_ids) > 1:
                raise ModelStepError("model step failed: RuntimeError: boom")
            return out

        monkeypatch.setattr(s.runner, "forward", forward)
        try:
            s.step()
        except ModelStepError as e:
            s.fail_step(e)
        monkeypatch.setattr(s.runner, "forward", real)
        b = next(r for r in [*s.outbox, *s.running] if r.rid == "b")  # overlapped: b's first token is pending
        assert (b.finished_reason or {}).get("fault") == ("model_step" if fail else None)
        assert seqs == [2] and s.running[0] is a  # b's chunk and a's decode token in one forward
        assert (s.pending is not None) and (s.pending.reqs == [a]) == fail  # the failure kept a's pending token
        while not a.finished:
            s.step()
        s.abort("", abort_all=True)
        s.outbox.clear()
        outs.append(list(a.output_ids))
        assert idle(s)
        s.kv.radix.flush()
    assert len(outs[0]) == 12 and outs[0] == outs[1]


@pytest.mark.parametrize("which", ["mixed", "plain"])
def test_prompt_logprobs_from_any_start_match_a_cold_forward(pair, tiny_model, which):
    """Prompt logprobs from logprob_start_len k, prefilled in 64-token chunks (the rows before k are
    not computed: logit_rows) and resumed from the prefix cache up to k, equal log_softmax of one cold
    forward over the whole prompt at every position from k, for k at and around chunk boundaries."""
    from .helpers import prompt_logits, seq_runner

    s = pair[0] if which == "mixed" else pair[1]
    prompt = random_prompt(330, seed=77)
    ref = torch.log_softmax(prompt_logits(seq_runner(tiny_model), prompt).float(), dim=-1)
    starts = [0, 1, 63, 64, 65, 130, 200, 329]
    schedule = {i: [dict(rid=f"k{k}", ids=prompt, max_new_tokens=2,
                         logprobs={"return_logprob": True, "logprob_start_len": k})]
                for i, k in enumerate(starts)}  # fmt: skip
    rec = drive(s, schedule)
    for k in starts:
        got = rec.inputs[f"k{k}"]
        assert [t for _, t in got] == prompt[k:], k
        want = [None if j == 0 else float(ref[j - 1, prompt[j]]) for j in range(k, len(prompt))]
        assert (got[0][0] is None) == (k == 0), k
        assert all(abs(g - w) < 1e-4 for (g, _), w in zip(got, want) if w is not None), k
    assert rec.cached["k329"] > 0  # later starts resumed from the cache
