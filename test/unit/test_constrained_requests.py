"""Request -> GrammarSpec in the HTTP process: validation (400s with a message), the framing rule of
the native API, and the chat layer's grammars; no scheduler involved."""

from __future__ import annotations

import asyncio
import json

import pytest

from sgl_inkling.chat.tokenizer import get_tokenizer
from sgl_inkling.constrained import GrammarError, GrammarSpec, chat_grammar, native_grammar
from sgl_inkling.entrypoints.openai.protocol import ChatCompletionRequest
from sgl_inkling.entrypoints.openai.serving_chat import _build, serve_chat
from sgl_inkling.managers.io_struct import GenerateReqInput, RequestError
from sgl_inkling.managers.tokenizer_manager import TokenizerManager
from sgl_inkling.sampling.sampling_params import SamplingParams
from sgl_inkling.server_args import ServerArgs

USER = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


def top_format(spec: GrammarSpec) -> dict:
    return json.loads(spec.structural_tag)["format"]


@pytest.mark.parametrize(
    "params,message",
    [
        ({"json_schema": "{not json"}, "not valid JSON"),
        ({"json_schema": '{"type": "objekt"}'}, "not a valid JSON schema at type"),
        ({"json_schema": '{"type": "string", "pattern": "(("}'}, "pattern"),
        ({"json_schema": "[1, 2]"}, "must be a JSON schema object"),
        ({"regex": "a[b"}, "invalid regex"),
        ({"regex": "(ab"}, "invalid regex"),
        ({"ebnf": 'root ::= "a'}, "invalid EBNF"),
        ({"ebnf": 'start ::= "a"'}, "root"),
    ],
)
def test_invalid_grammars_are_refused_with_a_message(tok, params, message):
    sp = SamplingParams(**params)
    with pytest.raises(GrammarError, match=message):
        native_grammar(tok, sp, [1, 2, 3])


def test_native_framing_depends_on_the_prompt(tok):
    sp = SamplingParams(json_schema='{"type": "object"}')
    raw = native_grammar(tok, sp, tok.encode("Give me JSON:"))
    assert raw.kind == "json_schema" and top_format(raw)["type"] == "grammar"  # the payload alone
    chat_prompt = [*tok.encode("hi"), tok.framing.end_message]
    framed = top_format(native_grammar(tok, sp, chat_prompt))
    tokens = json.dumps(framed)
    assert str(tok.framing.content_text) in tokens and str(tok.framing.content_thinking) not in tokens
    assert native_grammar(tok, SamplingParams(), [1]) is None


def test_chat_grammar_cases(tok):
    assert chat_grammar(tok) is None
    assert chat_grammar(tok, tools=[TOOL], tool_choice="none") is None
    assert chat_grammar(tok, tools=[TOOL]).kind == "tools"  # auto by default
    assert chat_grammar(tok, tools=[TOOL], tool_choice="required").kind == "tool_choice=required"
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert chat_grammar(tok, tools=[TOOL], tool_choice=named).kind == "tool_choice=get_weather"
    assert chat_grammar(tok, json_schema='{"type": "object"}').kind == "json_schema"
    with pytest.raises(GrammarError, match="not in tools"):
        chat_grammar(tok, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(GrammarError, match="needs tools"):
        chat_grammar(tok, tool_choice="required")
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
    with pytest.raises(GrammarError, match="type 'object'"):
        chat_grammar(tok, tools=[bad])
    with pytest.raises(GrammarError, match="a JSON schema object is required"):
        chat_grammar(tok, tools=[{"type": "function", "function": {"name": "f"}}])
    broken = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"type": 5}}}}}
    with pytest.raises(GrammarError, match="'f' parameters"):
        chat_grammar(tok, tools=[broken])


def test_reasoning_off_leaves_no_thinking_block(tok):
    thinking = str(tok.framing.content_thinking)
    off = chat_grammar(tok, tools=[TOOL], tool_choice="required", thinking=False)
    on = chat_grammar(tok, tools=[TOOL], tool_choice="required", thinking=True)
    assert thinking not in off.structural_tag and thinking in on.structural_tag


# -- the tokenizer manager: native requests ------------------------------------------------------


@pytest.fixture(scope="module")
def tm():
    return TokenizerManager(
        ServerArgs(), {"context_len": 4096, "vocab_size": 200058}, "ipc://unused", "ipc://unused"
    )


def test_tokenize_attaches_or_refuses_grammars(tm):
    tok_req, _ = tm._tokenize(GenerateReqInput(text="hi", sampling_params={"regex": "[0-9]+"}))
    assert isinstance(tok_req.grammar, GrammarSpec) and tok_req.grammar.kind == "regex"
    assert tm._tokenize(GenerateReqInput(text="hi"))[0].grammar is None
    with pytest.raises(RequestError, match="not a valid JSON schema"):
        tm._tokenize(GenerateReqInput(text="hi", sampling_params={"json_schema": '{"type": 3}'}))
    with pytest.raises(RequestError, match="only one of"):
        tm._tokenize(GenerateReqInput(text="hi", sampling_params={"regex": "a", "ebnf": 'root ::= "a"'}))
    with pytest.raises(RequestError, match="not a request field"):
        tm._tokenize(GenerateReqInput(text="hi", grammar={"structural_tag": "{}"}))


def test_batch_items_keep_the_chat_grammar():
    spec = GrammarSpec("{}", "tools")
    obj = GenerateReqInput(input_ids=[[1], [2]], grammar=spec)
    assert obj.item(1).grammar is spec


# -- the chat layer ------------------------------------------------------------------------------


class _StubTM:
    model_name = "m"
    context_len = 4096
    reasoning_parser = tool_call_parser = "inkling"

    def __init__(self, tokenizer):
        from sgl_inkling.multimodal.processor import media_processor

        self.tokenizer = tokenizer
        self.media = media_processor(None, {})  # text-only: no media in these requests


def test_chat_build_attaches_the_grammar(tok):
    req = ChatCompletionRequest(messages=USER, tools=[TOOL], tool_choice="required", reasoning_effort="none")
    _, choices = _build(_StubTM(tok), req)
    spec = choices[0].obj.grammar
    assert spec.kind == "tool_choice=required"
    assert str(tok.framing.content_thinking) not in spec.structural_tag
    plain = ChatCompletionRequest(messages=USER)
    assert _build(_StubTM(tok), plain)[1][0].obj.grammar is None


@pytest.mark.parametrize(
    "body,message",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}},
            "schema",
        ),
        ({"regex": "(("}, "invalid regex"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "object",
        ),
    ],
)
def test_chat_bad_grammars_are_400(tok, body, message):
    req = ChatCompletionRequest(messages=USER, **body)
    resp = asyncio.run(serve_chat(_StubTM(tok), req, None))
    assert resp.status_code == 400
    assert message in json.loads(resp.body)["message"]


def test_grammar_backend_none_refuses_constrained_requests():
    info = {"context_len": 4096, "vocab_size": 200058}
    off = TokenizerManager(ServerArgs(grammar_backend="none"), info, "ipc://unused", "ipc://unused")
    with pytest.raises(RequestError, match="--grammar-backend none"):
        off._tokenize(GenerateReqInput(text="hi", sampling_params={"regex": "[0-9]+"}))
    assert off._tokenize(GenerateReqInput(text="hi"))[0].grammar is None
