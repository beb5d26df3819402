"""TMLv0 grammars and the xgrammar matcher on the real vocabulary: token sequences in, masks out.

Masks are compared as exact sets where the format pins them (framing positions), and checked for
"no special token inside a payload" elsewhere. Random walks (a uniform pick among the allowed tokens
each step, i.e. a model with no preference at all) check that every finished output is valid.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import numpy as np
import pytest
import xgrammar as xgr

from sgl_inkling.chat.output_parser import parse_output
from sgl_inkling.chat.tokenizer import get_tokenizer
from sgl_inkling.constrained import GrammarSpec, chat_grammar
from sgl_inkling.constrained import formats as f
from sgl_inkling.constrained.backend import XGrammarBackend
from sgl_inkling.constrained.mask import unpack_bitmask
from sgl_inkling.constrained.request_grammar import payload_format
from sgl_inkling.constrained.tmlv0 import Framing, structured_turn
from sgl_inkling.constrained.vocab import special_token_ids

NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 500},
        "label": {"type": "string", "maxLength": 8},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "score": {"type": "number", "minimum": -1, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6}, "admin": {"type": "boolean"}},
            "required": ["name", "admin"],
        },
    },
    "required": ["id", "kind", "owner"],
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "record", "parameters": NESTED}},
]
TOOL_SCHEMAS = {"get_weather": WEATHER, "record": NESTED}


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


@pytest.fixture(scope="module")
def backend(tok):
    return XGrammarBackend(tok, tok.vocab_size)


@pytest.fixture(scope="module")
def fr(tok):
    return Framing.of(tok)


class Walk:
    """One request's matcher with helpers to read its mask as a set of token ids."""

    def __init__(self, backend: XGrammarBackend, spec: GrammarSpec):
        self.grammar = backend.new_request(spec)
        self.vocab = backend.vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, self.vocab)

    def allowed_ids(self) -> np.ndarray:
        self.grammar.fill(self.bitmask, 0)
        return np.flatnonzero(unpack_bitmask(self.bitmask, self.vocab)[0].numpy())  # torch's is slow here

    def allowed(self) -> set[int]:
        return set(self.allowed_ids().tolist())

    def feed(self, ids) -> Walk:
        for t in ids:
            assert self.grammar.accept(t), f"token {t} rejected"
        return self

    def rejects(self, t: int) -> bool:
        ok = self.grammar.accept(t)
        if ok:
            self.grammar.rollback(1)
        self.grammar.error = None
        return not ok

    def random_finish(self, seed: int, max_steps: int = 400) -> list[int]:
        rng, out = random.Random(seed), []
        while not self.grammar.terminated:
            assert len(out) < max_steps, "the walk did not terminate"
            ids = self.allowed_ids()
            t = int(ids[rng.randrange(len(ids))])
            self.feed([t])
            out.append(t)
        return out


def spec_of(fmt: f.Format, kind: str = "test") -> GrammarSpec:
    return GrammarSpec(f.structural_tag(fmt), kind)


def specials_in(ids: set[int], tok) -> set[int]:
    return {i for i in ids if tok.is_special(i)}


def stops(tok) -> set[int]:
    return set(tok.eos_token_ids)


# -- the vocabulary: specials are terminals, never text --------------------------------------------


@pytest.mark.parametrize(
    "payload,prefix",
    [
        (f.regex(r"[\s\S]*"), ""),
        (f.regex(r"[^a]+"), "b"),
        (f.ebnf('root ::= [^"]* "!"'), "x"),
        (f.json_schema({"type": "string"}, (",", ":")), '"ab'),
        (f.json_schema({"type": "object"}, (",", ":")), '{"k":"v'),
    ],
)
def test_special_tokens_never_match_as_text(tok, backend, payload, prefix):
    walk = Walk(backend, spec_of(payload)).feed(tok.encode(prefix))
    assert specials_in(walk.allowed(), tok) <= stops(tok)


def test_bounded_json_strings_exclude_control_characters(tok, backend):
    walk = Walk(backend, spec_of(f.json_schema(WEATHER, (",", ":")))).feed(tok.encode('{"city":"a'))
    bad = [i for i in walk.allowed() if any(b < 0x20 for b in tok.token_bytes(i)) and not tok.is_special(i)]
    assert bad == []


# -- structured output in a TMLv0 turn -------------------------------------------------------------


def test_structured_turn_masks_exactly_the_framing(tok, backend, fr):
    payload, _ = payload_format(
        json_schema=json.dumps({"type": "object", "properties": {"a": {"enum": [1]}}})
    )
    walk = Walk(backend, spec_of(structured_turn(fr, payload, thinking=True)))
    assert specials_in(walk.allowed(), tok) == {fr.message_model, fr.content_text, fr.content_thinking}
    walk.feed([fr.message_model])
    assert walk.allowed() == {fr.content_text, fr.content_thinking}
    walk.feed([fr.content_thinking])
    in_thinking = walk.allowed()
    assert specials_in(in_thinking, tok) == {fr.end_message}
    assert len(in_thinking) == tok.vocab_size - len(special_token_ids(tok)) + 1  # free: every ordinary token
    # A spelled-out end token is text: the block stays open.
    walk.feed(tok.encode("plan <|end_message|> more"))
    assert specials_in(walk.allowed(), tok) == {fr.end_message}
    walk.feed([fr.end_message])
    assert walk.allowed() == {fr.message_model}
    walk.feed([fr.message_model, fr.content_text])
    assert specials_in(walk.allowed(), tok) == set()
    walk.feed(tok.encode('{"a": 1}'))
    assert walk.allowed() == {fr.end_message}  # the end of the message is legal, and only it
    walk.feed([fr.end_message])
    assert walk.allowed() == stops(tok)  # ... and then the end of the turn
    walk.feed([tok.token_id("content_model_end_sampling")])
    assert walk.grammar.terminated


def test_structured_turn_without_thinking_and_header_less(tok, backend, fr):
    payload, _ = payload_format(regex="[0-9]{2}")
    walk = Walk(backend, spec_of(structured_turn(fr, payload, thinking=False)))
    assert specials_in(walk.allowed(), tok) == {fr.message_model, fr.content_text}
    assert walk.rejects(fr.content_thinking)
    walk.feed([fr.content_text, *tok.encode("42"), fr.end_message])
    assert walk.allowed() == stops(tok)


def test_native_payload_alone_then_stop(tok, backend):
    payload, _ = payload_format(regex="[a-c]{3}")
    walk = Walk(backend, spec_of(payload))
    assert specials_in(walk.allowed(), tok) == set()
    walk.feed(tok.encode("abc"))
    assert walk.allowed() == stops(tok)


# -- tool calls ------------------------------------------------------------------------------------


def tools_spec(tok, choice, parallel=True, thinking=False):
    return chat_grammar(tok, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel, thinking=thinking)


def test_auto_allows_free_text_and_only_declared_tool_names(tok, backend, fr):
    walk = Walk(backend, tools_spec(tok, "auto", thinking=True))
    first = walk.allowed()
    assert {fr.message_model, fr.content_text, fr.content_thinking} <= first
    assert fr.content_invoke_tool_json not in first  # no nameless call
    assert tok.encode("get")[0] in first and tok.encode("rec")[0] in first
    # An undeclared tool name dies at its first wrong token.
    walk.feed([fr.message_model, *tok.encode("get_")])
    assert walk.rejects(tok.encode("time")[0])
    walk.feed(tok.encode("weather"))
    assert walk.allowed() == {fr.content_invoke_tool_json}
    walk.feed([fr.content_invoke_tool_json, *tok.encode('{"name":"')])
    assert walk.rejects(tok.encode("record")[0])  # the JSON must name the header's tool
    walk.feed(tok.encode('get_weather","args":{"city":"Oslo"}}'))
    assert walk.allowed() == {fr.end_message}
    walk.feed([fr.end_message])
    assert walk.allowed() == {fr.message_model} | stops(tok)  # more blocks (parallel) or the end
    # Free text after a call stays free.
    walk.feed([fr.message_model, fr.content_text, *tok.encode("Done."), fr.end_message])
    assert walk.allowed() == {fr.message_model} | stops(tok)


def test_auto_without_parallel_calls_ends_after_one_call(tok, backend, fr):
    walk = Walk(backend, tools_spec(tok, "auto", parallel=False))
    walk.feed([fr.content_text, *tok.encode("Let me check."), fr.end_message, fr.message_model])
    walk.feed([*tok.encode("get_weather"), fr.content_invoke_tool_json])
    walk.feed([*tok.encode('{"name":"get_weather","args":{"city":"Rome","unit":"c"}}'), fr.end_message])
    assert walk.allowed() == stops(tok)


@pytest.mark.parametrize("thinking", [False, True])
def test_required_forbids_text_and_demands_a_call(tok, backend, fr, thinking):
    walk = Walk(backend, tools_spec(tok, "required", thinking=thinking))
    first = specials_in(walk.allowed(), tok)
    assert fr.content_text not in first and not (first & stops(tok))
    assert (fr.content_thinking in first) == thinking
    walk.feed([*tok.encode("record"), fr.content_invoke_tool_json])
    args = {"id": 3, "kind": "beta", "owner": {"name": "ann", "admin": True}}
    walk.feed(
        [*tok.encode(json.dumps({"name": "record", "args": args}, separators=(",", ":"))), fr.end_message]
    )
    assert walk.allowed() == {fr.message_model} | stops(tok)


def test_named_tool_choice_allows_that_tool_only(tok, backend, fr):
    walk = Walk(backend, tools_spec(tok, {"type": "function", "function": {"name": "record"}}))
    assert walk.rejects(tok.encode("get")[0])
    walk.feed([fr.message_model, *tok.encode("record"), fr.content_invoke_tool_json])
    assert specials_in(walk.allowed(), tok) == set()


# -- rollback --------------------------------------------------------------------------------------


def test_rollback_restores_the_masks(tok, backend, fr):
    walk = Walk(backend, tools_spec(tok, "required"))
    masks, ids = (
        [walk.allowed()],
        [*tok.encode("get_weather"), fr.content_invoke_tool_json, *tok.encode('{"name')],
    )
    for t in ids:
        walk.feed([t])
        masks.append(walk.allowed())
    for k in (1, 3, len(ids) - 4):
        walk.grammar.rollback(k)
        assert walk.allowed() == masks[len(ids) - k]
        walk.feed(ids[len(ids) - k :])
        assert walk.allowed() == masks[-1]
    assert walk.grammar.accept_many([tok.encode('":"')[0], 999999]) == 1  # stops at the bad token
    walk.grammar.rollback(walk.grammar.num_accepted)
    assert walk.allowed() == masks[0]
    with pytest.raises(ValueError):
        walk.grammar.rollback(1)


# -- random walks: valid output whatever the model prefers -----------------------------------------


@pytest.mark.parametrize("choice", ["required", "record", "get_weather"])
def test_random_tool_calls_parse_and_validate(tok, backend, choice):
    named = {"type": "function", "function": {"name": choice}} if choice != "required" else choice
    spec = tools_spec(tok, named, parallel=False)
    for seed in range(30):
        out = Walk(backend, spec).random_finish(seed)
        calls = parse_output(out, tok).tool_calls
        assert len(calls) == 1, tok.decode(out)
        assert choice == "required" or calls[0].name == choice
        jsonschema.validate(json.loads(calls[0].arguments), TOOL_SCHEMAS[calls[0].name])


def test_random_structured_outputs_validate(tok, backend, fr):
    cases = [
        (
            payload_format(json_schema=json.dumps(NESTED))[0],
            lambda s: jsonschema.validate(json.loads(s), NESTED),
        ),
        (
            payload_format(regex=r"[A-Z][a-z]{1,4}-\d{2}")[0],
            lambda s: re.fullmatch(r"[A-Z][a-z]{1,4}-\d{2}", s),
        ),
    ]
    for payload, check in cases:
        for framed in (False, True):
            fmt = structured_turn(fr, payload, thinking=False) if framed else payload
            for seed in range(15):
                out = Walk(backend, spec_of(fmt)).random_finish(seed)
                assert out[-1] in stops(tok)
                text = tok.decode(out, skip_special_tokens=True)
                assert check(text) is not False, text


# -- the backend -----------------------------------------------------------------------------------


def test_compiled_grammars_are_cached_by_key(tok, backend):
    spec = tools_spec(tok, "required")
    before = backend.stats()
    assert backend.compile(spec) is backend.compile(GrammarSpec(spec.structural_tag, "other kind"))
    after = backend.stats()
    assert after["grammar_compiles"] - before["grammar_compiles"] <= 1
    assert after["grammar_cache_hits"] > before["grammar_cache_hits"]


def test_cache_evicts_the_least_recently_used(tok):
    small = XGrammarBackend(tok, tok.vocab_size, cache_entries=2)
    specs = [spec_of(f.regex(p)) for p in ("a+", "b+", "c+")]
    first = small.compile(specs[0])
    small.compile(specs[1])
    small.compile(specs[0])  # used again: now "b+" is the oldest
    small.compile(specs[2])
    assert small.stats()["grammar_cache_entries"] == 2
    assert small.compile(specs[0]) is first
    first.result()
    assert small.stats()["grammar_compiles"] == 3 and small.cache_bytes() > 0
    small.shutdown()
