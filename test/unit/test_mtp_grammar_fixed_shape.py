"""Grammar-constrained requests drafting through the fixed-shape MTP step (DraftStep, what CUDA
graphs replay; eager here): depth 1 is masked inside the step by the grammar's state, deeper drafts
are unconstrained and the host caps each request at the longest legal prefix. Greedy output of
json_schema and tool-call requests, alone and batched with free ones, equals a scheduler's without
MTP; no draft past the first illegal one is acceptable; pools return to idle.

On inkling-tiny-draftable, where depths draft well enough that steps accept several drafts.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from sgl_inkling.chat.output_parser import parse_output
from sgl_inkling.constrained import chat_grammar, native_grammar
from sgl_inkling.constrained.mask import unpack_bitmask
from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.managers.scheduler import Scheduler
from test.e2e.mtp_common import SCHEMA

from .helpers import draftable_scheduler, in_process_scheduler, random_prompt, replaying_graph_runner

BAD = 200053  # <|unused_200053|>: no grammar here ever allows it
ARGS = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["q", "n"]}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": n, "parameters": ARGS}} for n in ("find", "count")]


@pytest.fixture(scope="module")
def sched(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory)


@pytest.fixture(scope="module")
def want(tmp_path_factory) -> list[list[int]]:
    """The CASES' outputs on the same checkpoint without MTP: the reference."""
    from sgl_inkling.models.inkling.tiny_draftable import ensure_draftable_checkpoint
    from sgl_inkling.server_args import ServerArgs

    path = str(ensure_draftable_checkpoint())
    args = ServerArgs(model_path=path, device="cpu", disable_radix_cache=True)
    with in_process_scheduler(args, tmp_path_factory) as s:
        reqs = run_batch(s, "plain")
        check_grammar_outputs(s, reqs)
        return [r.output_ids for r in reqs]


def submit(s: Scheduler, rid: str, ids: list[int], kind: str | None, new_tokens: int):
    from sgl_inkling.sampling.sampling_params import SamplingParams

    params = {"temperature": 0, "max_new_tokens": new_tokens}
    if kind == "json":
        params["json_schema"] = json.dumps(SCHEMA)
    sp = SamplingParams.from_dict(params if kind else {**params, "ignore_eos": True})
    grammar = None
    if kind == "json":
        grammar = native_grammar(s.tokenizer, sp, ids)
    elif kind == "tools":
        grammar = chat_grammar(s.tokenizer, tools=TOOLS, tool_choice="required", thinking=False)
    s.handle(TokenizedGenerateReq(rid=rid, input_ids=list(ids), sampling_params=sp, grammar=grammar))
    return s.waiting[-1]


CASES = [("json", 14), ("tools", 21), (None, 27)]  # (grammar, prompt length)


def run_batch(s: Scheduler, tag: str) -> list:
    """The CASES at once, greedy: constrained requests until their grammar ends them, free ones 20 tokens."""
    reqs = [submit(s, f"{tag}{i}", random_prompt(n, seed=70 + n), kind, 60 if kind else 20)
            for i, (kind, n) in enumerate(CASES)]  # fmt: skip
    while any(not r.finished for r in reqs):
        s.step()
        s.outbox.clear()
    return reqs


def check_grammar_outputs(s: Scheduler, reqs) -> None:
    """Every constrained request ended by its grammar (a token it rejects aborts the request) with
    output that parses and validates."""
    for r, (kind, _) in zip(reqs, CASES):
        if kind is None:
            continue
        assert r.finished_reason["type"] == "stop", r.finished_reason
        if kind == "json":
            obj, _ = json.JSONDecoder().raw_decode(s.tokenizer.decode(r.output_ids))
            jsonschema.validate(obj, SCHEMA)
        else:
            calls = parse_output(r.output_ids, s.tokenizer).tool_calls
            assert len(calls) == 1 and calls[0].name in ("find", "count"), s.tokenizer.decode(r.output_ids)
            jsonschema.validate(json.loads(calls[0].arguments), ARGS)


def at_baseline(s: Scheduler) -> bool:
    return s.kv.full.available == s.kv.full.num_slots and s.kv.swa.available == s.kv.swa.num_slots


class Spy:
    """Records, per fixed-shape draft step, each open constrained request's drafts, the cap the
    worker set, and the legal prefix a fresh walk of its grammar gives (the reference); optionally
    boosts BAD at some depths of every request's draft logits."""

    def __init__(self, s: Scheduler, boost_depths: tuple[int, ...] = ()):
        self.s, self.spec = s, s.spec
        self.walks: list[tuple[str, list[int], int, int, bool]] = []  # rid, drafts, limit, legal, BAD allowed
        self.free_first: list[int] = []  # depth-1 drafts of free requests
        self.masked_picks = 0
        self.verified: dict[str, list[tuple[int, int]]] = {}  # rid -> (accepted, limit) per verify
        self._walk, self._pick, self._fwd = self.spec._walk_drafts, self.spec.step.pick, s.runner.forward_mtp
        self._observe = self.spec.observe
        self.spec._walk_drafts, self.spec.step.pick, self.spec.observe = self.walk, self.pick, self.observe
        self.boost_depths = boost_depths
        s.runner.forward_mtp = self.forward_mtp

    def remove(self) -> None:
        self.spec._walk_drafts, self.spec.step.pick, self.s.runner.forward_mtp = self._walk, self._pick, self._fwd
        self.spec.observe = self._observe

    def observe(self, accepted, limits):
        for q, a, n in zip(self.s.step_reqs, accepted, limits):
            self.verified.setdefault(q.rid, []).append((a, n))
        self._observe(accepted, limits)

    def forward_mtp(self, depth, prev, batch):
        out = self._fwd(depth, prev, batch)
        if depth in self.boost_depths and out.logits.shape[0]:
            vocab = self.s.runner.model.draft_vocab
            col = BAD if vocab is None else vocab.tolist().index(BAD)
            out.logits[:, col] = out.logits.max() + 100.0  # the unmasked argmax of every row
        return out

    def pick(self, logits, mask=None):
        self.masked_picks += mask is not None
        return self._pick(logits, mask)

    def walk(self, reqs, rows, k):
        open_ = [q.draft_open for q in reqs]
        bad_ok = [bool(unpack_bitmask(q.draft_masks[:1], self.s.vocab)[0, BAD]) if o else False
                  for q, o in zip(reqs, open_)]  # fmt: skip
        self._walk(reqs, rows, k)
        if not k:  # a catch-up that drafts nothing
            return
        drafts = self.spec.draft_buf[rows, :k].tolist()
        for q, o, ok, d in zip(reqs, open_, bad_ok, drafts):
            if not o:
                if q.grammar is None and not q.finished:
                    self.free_first.append(d[0])
                continue
            legal = q.grammar.accept_many(d)  # stops after a rejected token or where the grammar ends
            q.grammar.rollback(legal)
            self.walks.append((q.rid, d, q.draft_limit, legal, ok))


@pytest.fixture
def fixed(sched):
    sched.spec.configure(adaptive=False)  # all 8 depths every step
    sched.spec.fixed_shapes = True
    yield
    sched.spec.fixed_shapes = False


@pytest.mark.parametrize("graphs", [False, True], ids=["eager-step", "graph-runner"])
def test_constrained_batch_drafts_on_the_fixed_shape_step(sched, want, fixed, graphs):
    """Greedy json_schema and tool-call requests batched with a free one: the plain scheduler's
    output, valid, with every draft step after the prompt's on DraftStep (directly, or through the
    graph runner's static buffers: 3 requests pad to bucket 4, fewer run at 2 and 1)."""
    spy = Spy(sched)
    g = sched.spec.draft_graphs = replaying_graph_runner(sched.spec) if graphs else None
    try:
        got = run_batch(sched, f"f{graphs}")
    finally:
        spy.remove()
        sched.spec.draft_graphs = None
    assert [r.output_ids for r in got] == want
    check_grammar_outputs(sched, got)
    # The step drafted for every constrained request (after its first drafts, from the prompt)
    # and masked its first draft: one walk per verify of each but its last.
    for r, (kind, _) in zip(got, CASES):
        if kind:
            walks = sum(1 for w in spy.walks if w[0] == r.rid)
            assert walks == r.spec_verify_ct - 1 and walks > 3, (r.rid, walks, r.spec_verify_ct)
    assert spy.masked_picks > 0
    assert g is None or {4, 2, 1} <= set(g.replayed), g.replayed
    assert all(limit == legal >= 1 for _, _, limit, legal, _ in spy.walks), spy.walks
    accepted = {r.rid: r.spec_accepted_drafts for r, (kind, _) in zip(got, CASES) if kind}
    assert sum(accepted.values()) > 10, accepted  # drafts of constrained requests are accepted
    assert at_baseline(sched)


@pytest.mark.parametrize("token_map", [False, True], ids=["full-vocab", "token-map"])
def test_first_draft_is_masked_in_the_step_and_illegal_drafts_cap_the_rest(sched, want, fixed, token_map,
                                                                           monkeypatch):  # fmt: skip
    """Drafts 1 and 2 are BAD for every request without a mask. A free request drafts BAD first; a
    constrained one drafts a legal token (its grammar's mask, applied in the step, also over a draft
    vocabulary), then BAD (unconstrained past depth 1): its cap stops at draft 1, so no later draft
    is verified as acceptable. Outputs stay the plain scheduler's. Two drafts a step (all it takes)."""
    monkeypatch.setattr(sched.spec, "choose", lambda n: 2)
    sched.spec.k = 2
    if token_map:  # the continuations, BAD and filler: column j of the draft logits is vocab[j]
        used = sorted({t for w in want for t in w} | {BAD})
        sched.runner.model.set_draft_vocab(torch.tensor(used + [t for t in range(5000) if t not in used][:300]))
    spy = Spy(sched, boost_depths=(0, 1))
    try:
        got = run_batch(sched, f"m{token_map}")
    finally:
        spy.remove()
        sched.runner.model.set_draft_vocab(None)
    assert [r.output_ids for r in got] == want
    check_grammar_outputs(sched, got)
    assert spy.free_first and set(spy.free_first) == {BAD}  # the boost wins where nothing masks it
    assert spy.walks and not any(ok for *_, ok in spy.walks)  # BAD is illegal at every constrained step
    assert all(d[0] != BAD and d[1] == BAD and limit == legal == 1 for _, d, limit, legal, _ in spy.walks), spy.walks
    for r, (kind, _) in zip(got, CASES):
        if kind:  # after the first verify (its drafts came from the prompt's ragged chain)
            assert all(a <= n <= 1 for a, n in spy.verified[r.rid][1:]), spy.verified[r.rid]
            assert sum(a for a, _ in spy.verified[r.rid][1:]) > 0  # draft 1 was right at times
    assert at_baseline(sched)


def test_constrained_requests_catch_up_on_the_fixed_shape_step(sched, want, fixed, monkeypatch):
    """Steps alternate between plain decode (k = 0: the depths lag) and drafting ones: the depths
    of the constrained requests catch up through DraftStep, which also drafts the step's k tokens
    from the pending one, masked and capped as after a verify. Outputs stay the plain scheduler's."""
    sched.spec.configure(adaptive=True)
    picks = iter([0, 0, 3, 0, 8, 0, 2, 0, 0, 5] * 20)
    monkeypatch.setattr(sched.spec, "choose", lambda n: next(picks))
    before = (sched.spec.num_plain_steps, sched.spec.num_catch_ups)
    spy, orig, in_catch_ups = Spy(sched), sched.spec.catch_up, []

    def catch_up(reqs, k):
        n = len(spy.walks)
        orig(reqs, k)
        in_catch_ups.extend(spy.walks[n:])

    monkeypatch.setattr(sched.spec, "catch_up", catch_up)
    try:
        got = run_batch(sched, "k")
    finally:
        spy.remove()
    assert [r.output_ids for r in got] == want
    check_grammar_outputs(sched, got)
    assert sched.spec.num_plain_steps > before[0] and sched.spec.num_catch_ups > before[1]
    # Each verify but the first (drafted from the prompt) verified the drafts of one walk, after a
    # verify or in a catch-up.
    for r, (kind, _) in zip(got, CASES):
        if kind:
            walks = sum(1 for w in spy.walks if w[0] == r.rid)
            assert walks == r.spec_verify_ct - 1, (r.rid, walks, r.spec_verify_ct)
            assert any(w[0] == r.rid for w in in_catch_ups), r.rid
    assert all(limit == legal >= 1 for _, _, limit, legal, _ in spy.walks), spy.walks
    assert at_baseline(sched)
