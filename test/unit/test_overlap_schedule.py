"""Overlap scheduling (issue 20 item 2) in-process on inkling-tiny: the same scripted traffic (arrivals
at fixed steps, aborts once a client has seen k tokens) runs with overlap on and with
--disable-overlap-schedule, and what the detokenizer receives (tokens, logprobs, top logprobs,
finish reasons, stop strings, chunking of streamed outputs) is the same. Stop tokens, stop strings,
grammars and retraction are also checked against an independent reference: the unstopped greedy run (aborts: a prefix of it),
a brute-force stop-string scan, the regex itself, a run without memory pressure. Pools return to
their idle baseline after every script (and to full after a flush)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
import torch

from sgl_inkling.chat.tokenizer import get_tokenizer
from sgl_inkling.constrained.request_grammar import native_grammar
from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.managers.scheduler import Scheduler
from sgl_inkling.sampling.sampler import Sampler
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo
from sgl_inkling.sampling.sampling_params import SamplingParams
from sgl_inkling.server_args import ServerArgs

from .helpers import close_scheduler, new_scheduler, random_prompt


def make_scheduler(tiny_path, tmp_path_factory, **kw) -> Scheduler:
    return new_scheduler(ServerArgs(model_path=str(tiny_path), device="cpu", **kw), tmp_path_factory)


@pytest.fixture(scope="module")
def sched(tiny_path, tmp_path_factory):
    s = make_scheduler(tiny_path, tmp_path_factory)
    yield s
    close_scheduler(s)


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


class Capture:
    """Stands in for the socket to the detokenizer."""

    def __init__(self):
        self.msgs = []

    def send_pyobj(self, msg, flags: int = 0) -> None:
        self.msgs.append(msg)


@dataclass
class Stream:
    """What one client received."""

    chunks: list[list[int]] = field(default_factory=list)
    logprobs: list[tuple[float, int]] = field(default_factory=list)
    top: list[list[tuple[float, int]]] = field(default_factory=list)
    finish: dict | None = None
    stop_str: str | None = None
    cached: int = 0

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.chunks for t in c]


def req(rid: str, ids: list[int], grammar=None, logprobs: int | None = None, stream: bool = True, **params):
    sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, **params})
    return TokenizedGenerateReq(rid=rid, input_ids=list(ids), sampling_params=sp, grammar=grammar,
                                return_logprob=logprobs is not None, top_logprobs_num=logprobs or 0,
                                stream=stream)  # fmt: skip


def drive(s: Scheduler, overlap: bool, arrivals: dict[int, list], abort_after: dict[str, int] | None = None):
    """The event loop, one iteration per scripted step; returns each client's stream."""
    mode, s.overlap = s.overlap, overlap
    sock, s.send_sock = s.send_sock, Capture()
    streams: dict[str, Stream] = {}
    arrivals = {k: list(v) for k, v in arrivals.items()}
    abort_after = dict(abort_after or {})

    def fold():
        for m in s.send_sock.msgs:
            for i, rid in enumerate(m.rids):
                st = streams.setdefault(rid, Stream())
                assert st.finish is None, f"{rid} got output after it finished"
                st.chunks.append(list(m.new_token_ids[i]))
                st.logprobs += m.output_token_logprobs[i] or []
                st.top += m.output_top_logprobs[i] or []
                st.finish, st.stop_str, st.cached = m.finished_reasons[i], m.stop_strs[i], m.cached_tokens[i]
        s.send_sock.msgs.clear()

    step = 0
    try:
        while arrivals or s.waiting or s.running or s.partial:
            for msg in arrivals.pop(step, []):
                s.handle(msg)
            try:
                s.step()
            except Exception as e:
                s.fail_step(e)
            s.flush_outbox()
            fold()
            for rid, k in list(abort_after.items()):
                if rid in streams and len(streams[rid].tokens) >= k:
                    del abort_after[rid]
                    s.abort(rid)
                    fold()
            step += 1
            assert step < 2000
    finally:
        s.send_sock, s.overlap = sock, mode
    assert_idle_baseline(s)
    return streams


def assert_idle_baseline(s: Scheduler) -> None:
    st = s.kv.stats()
    cached = st.get("radix_cached_tokens", 0)
    assert st["full_kv_available"] + cached == st["full_kv_total"], st
    assert st["swa_kv_available"] + st.get("radix_swa_tokens", 0) == st["swa_kv_total"], st
    assert st["req_slots_available"] == st["req_slots_total"], st
    if s.kv.radix is not None:
        assert st["sconv_checkpoints_available"] + st["radix_checkpoints"] == st["sconv_checkpoints_total"], st
        s.kv.radix.flush()  # cold again for the next run
        st = s.kv.stats()
    for kind in ("full_kv", "swa_kv", "req_slots"):
        assert st[f"{kind}_available"] == st[f"{kind}_total"], st


def both(s: Scheduler, arrivals, abort_after=None, same_chunks: bool = True) -> dict[str, Stream]:
    """Run the script synchronously and overlapped; they must agree; returns the overlapped run.
    (A retracting step commits the pending step first, so its tokens can go out in one message with
    the next step's: `same_chunks` off compares the tokens only.)"""
    before = dict(s.decode_steps)
    sync = drive(s, False, arrivals, abort_after)
    overlapped = drive(s, True, arrivals, abort_after)
    assert s.decode_steps["overlap_decode_steps"] > before["overlap_decode_steps"]
    compare(sync, overlapped, same_chunks)
    return overlapped


def compare(sync: dict[str, Stream], overlapped: dict[str, Stream], same_chunks: bool = True) -> None:
    assert sorted(sync) == sorted(overlapped)
    for rid in sync:
        a, b = sync[rid], overlapped[rid]
        assert a.tokens == b.tokens, rid
        assert a.chunks == b.chunks or not same_chunks, rid  # streamed in the same pieces
        assert (a.finish, a.stop_str) == (b.finish, b.stop_str), rid
        assert [t for _, t in a.logprobs] == [t for _, t in b.logprobs], rid
        assert [v for v, _ in a.logprobs] == pytest.approx([v for v, _ in b.logprobs], abs=1e-4), rid
        assert [[t for _, t in row] for row in a.top] == [[t for _, t in row] for row in b.top], rid


def greedy_reference(s: Scheduler, prompts: dict[str, list[int]], n: int) -> dict[str, list[int]]:
    """The prompts together, synchronously, with no stop conditions."""
    streams = drive(s, False, {0: [req(rid, ids, max_new_tokens=n) for rid, ids in prompts.items()]})
    assert all(len(st.tokens) == n for st in streams.values())
    return {rid: st.tokens for rid, st in streams.items()}


def test_concurrent_mixed_requests_match_the_synchronous_path(sched, tok):
    s = sched
    prompts = {f"r{i}": random_prompt(12 + 7 * i, seed=100 + i) for i in range(7)}
    ref = greedy_reference(s, {k: prompts[k] for k in ("r2", "r3", "r6")}, 10)
    stop_tok = ref["r2"][5]
    stop_at = ref["r2"].index(stop_tok) + 1
    text = tok.decode(ref["r3"][5:7])
    # Brute force: the first prefix whose decoded tail (as the scheduler decodes it) holds the string.
    str_at = next(k for k in range(1, 11) if text in tok.decode(ref["r3"][:k][-(len(text) + 8) :]))
    arrivals = {
        0: [req("r0", prompts["r0"], max_new_tokens=3), req("r1", prompts["r1"], max_new_tokens=12, logprobs=3),
            req("r2", prompts["r2"], max_new_tokens=10, stop_token_ids=[stop_tok]),
            req("r6", prompts["r6"], max_new_tokens=10)],
        2: [req("r3", prompts["r3"], max_new_tokens=10, stop=[text])],
        4: [req("r4", prompts["r4"], max_new_tokens=6, logprobs=0, stream=False),
            req("r5", prompts["r5"], max_new_tokens=1)],
    }  # fmt: skip
    out = both(s, arrivals, abort_after={"r6": 4})  # r6 is aborted once its client has 4 tokens
    r6 = out["r6"].tokens
    assert out["r6"].finish["type"] == "abort" and 4 <= len(r6) < 10 and r6 == ref["r6"][: len(r6)]
    assert out["r2"].tokens == ref["r2"][:stop_at] and out["r2"].finish["matched"] == stop_tok
    assert out["r3"].tokens == ref["r3"][:str_at] and out["r3"].stop_str == text
    assert [len(out[r].tokens) for r in ("r0", "r1", "r4", "r5")] == [3, 12, 6, 1]
    assert len(out["r1"].top) == 12 and all(len(row) == 3 for row in out["r1"].top)
    assert len(out["r4"].chunks) == 2  # unstreamed: the first token (its TTFT), then the end


def test_stream_interval_chunks_match(sched):
    s = sched
    s.stream_interval = 3
    try:
        both(s, {0: [req("a", random_prompt(20, seed=7), max_new_tokens=8),
                     req("b", random_prompt(9, seed=8), max_new_tokens=5)]})  # fmt: skip
    finally:
        s.stream_interval = 1


def test_seeded_sampling_and_penalties_match(sched):
    s = sched
    sampled = dict(temperature=0.9, top_k=50, top_p=0.95)
    arrivals = {
        0: [req("s1", random_prompt(15, seed=11), max_new_tokens=8, seed=5, **sampled),
            req("s2", random_prompt(25, seed=12), max_new_tokens=6, seed=6, frequency_penalty=0.5, **sampled)],
        2: [req("g", random_prompt(18, seed=13), max_new_tokens=6, repetition_penalty=1.3, logprobs=2)],
    }  # fmt: skip
    both(s, arrivals)


def test_grammar_requests_match_and_obey_the_grammar(sched, tok):
    s = sched
    prompt = random_prompt(14, seed=21)
    regex = r"[a-z]{2,6}"
    schema = '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}'
    g1 = native_grammar(tok, SamplingParams(regex=regex), prompt)
    g2 = native_grammar(tok, SamplingParams(json_schema=schema), prompt)
    arrivals = {
        0: [req("re", prompt, grammar=g1, max_new_tokens=24, ignore_eos=False),
            req("free", random_prompt(10, seed=22), max_new_tokens=12)],
        1: [req("js", prompt, grammar=g2, max_new_tokens=40, ignore_eos=False, logprobs=1)],
    }  # fmt: skip
    out = both(s, arrivals)
    assert out["re"].finish["type"] == "stop"
    assert re.fullmatch(regex, tok.decode(out["re"].tokens, skip_special_tokens=True))
    assert out["js"].finish["type"] in ("stop", "length")


def test_finished_request_state_is_cached_whole(sched):
    """The extra step after a request finishes consumes its last token: the prefix cache then holds the
    whole output, and a continuation resuming there decodes as a cold one does."""
    s = sched
    prompt = random_prompt(40, seed=41)
    first = drive(s, True, {0: [req("t1", prompt, max_new_tokens=5)]})["t1"].tokens
    turn2 = prompt + first + random_prompt(6, seed=42)
    s.kv.radix.flush()
    cold = drive(s, True, {0: [req("cold", turn2, max_new_tokens=4)]})["cold"]
    for overlap in (False, True):
        # drive() leaves the cache cold, so each pass first runs turn one in one process.
        script = {0: [req("t1", prompt, max_new_tokens=5)], 8: [req("t2", turn2, max_new_tokens=4)]}
        streams = drive(s, overlap, script)
        assert streams["t1"].tokens == first and streams["t2"].tokens == cold.tokens
        # Synchronously the last token was never fed back; overlapped the extra step fed it.
        assert streams["t2"].cached == len(prompt) + len(first) - (0 if overlap else 1)


def test_prefill_then_decode_without_committing_uses_device_and_host_tokens(sched):
    """A decode step whose requests are partly pending (tokens on the device) and partly just
    prefilled (tokens on the host) gathers both; the outputs match the synchronous run."""
    s = sched
    prompts = {"p": random_prompt(13, seed=51), "q": random_prompt(17, seed=52)}
    ref = greedy_reference(s, prompts, 5)
    s.overlap = True
    s.handle(req("p", prompts["p"], max_new_tokens=5))
    s.step()  # prefill p
    s.step()  # decode: p's second token pending
    assert s.pending is not None and s.pending.reqs == s.running
    s.handle(req("q", prompts["q"], max_new_tokens=5))
    s.run_prefill()  # not through step(): the pending decode stays uncommitted
    assert s.pending is not None and len(s.running) == 2
    s.run_decode()
    while s.running or s.waiting:
        s.step()
    got = {r.rid: r.output_ids for r in dict.fromkeys(s.outbox) if r.finished}
    s.outbox.clear()
    assert got == ref
    assert_idle_baseline(s)


def test_retraction_under_a_tiny_kv_budget(tiny_path, tmp_path_factory, sched):
    prompts = {f"m{i}": random_prompt(16, seed=60 + i) for i in range(3)}
    ref = greedy_reference(sched, prompts, 10)
    small = make_scheduler(tiny_path, tmp_path_factory, max_total_tokens=60)
    script = {0: [req(r, p, max_new_tokens=10) for r, p in prompts.items()]}
    try:
        sync = drive(small, False, script)
        retracted, fallbacks = small.num_retracted, small.decode_steps["sync_decode_steps"]
        out = drive(small, True, script)
        assert retracted > 0 and small.num_retracted > retracted  # both runs retracted
        assert small.decode_steps["sync_decode_steps"] > fallbacks  # the overlapped run fell back to retract
        compare(sync, out, same_chunks=False)
        assert {r: o.tokens for r, o in out.items()} == ref
    finally:
        close_scheduler(small)


def test_flag_and_mtp_fallback():
    a = ServerArgs(device="cpu")
    assert not a.disable_overlap_schedule
    from sgl_inkling.server_args import parse_server_args

    assert parse_server_args(["--disable-overlap-schedule", "--device", "cpu"]).disable_overlap_schedule


def test_overlap_is_on_by_default_and_off_with_mtp(sched, tmp_path_factory):
    from test.unit.helpers import draftable_scheduler

    assert sched.internal_state()["overlap_schedule"] is True
    gen = draftable_scheduler(tmp_path_factory)
    mtp = next(gen)
    try:
        assert mtp.internal_state()["overlap_schedule"] is False
    finally:
        gen.close()


def test_late_host_copy_reads_what_to_host_reads():
    logits = torch.randn(2, 3000, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=20, seed=3)]
    info = SamplingBatchInfo.from_params(params, logits.shape[1])
    out = Sampler(seed=1).sample(logits, info, steps=[0, 0], top_logprobs_nums=[2, 4],
                                 token_ids_logprobs=[[1, 2], None])  # fmt: skip
    assert out.to_host_later()() == out.to_host()
