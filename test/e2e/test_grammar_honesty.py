"""Issue 18 item 10 through HTTP: constrained output is honoured or refused, never quietly violated.

- min_new_tokens with a grammar (which may end the output first) is a 400 naming it;
- a JSON-schema keyword xgrammar does not enforce is a 400 naming it (native, chat, tool schemas);
- tool_choice required / named on a server without --tool-call-parser still fills tool_calls.
A long request in flight is unharmed throughout, and every pool returns to its idle baseline."""

from __future__ import annotations

import json

import jsonschema
import pytest

from .bystander import Bystander

CHAT = {"model": "inkling-tiny", "messages": [{"role": "user", "content": "answer"}], "max_tokens": 40}
TAGS = {"type": "object", "properties": {"t": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}},
        "required": ["t"]}  # fmt: skip
TOOL = {"type": "function", "function": {"name": "ping", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}}}  # fmt: skip


def refused(r, word: str) -> None:
    assert r.status_code == 400, r.text
    assert word in r.json()["message"], r.text


def test_min_new_tokens_with_a_grammar_is_refused(server):
    with Bystander(server):
        sp = {"regex": "(yes|no)", "min_new_tokens": 6, "max_new_tokens": 10}
        refused(server.post("/generate", {"text": "ok?", "sampling_params": sp}), "min_new_tokens")
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}
        refused(server.post("/v1/chat/completions", {**CHAT, "min_tokens": 3, "response_format": rf}),
                "min_new_tokens")  # fmt: skip
        # Without the grammar min_new_tokens is honoured.
        out = server.generate(text="ok?", sampling_params={"min_new_tokens": 6, "max_new_tokens": 8})
        assert len(out["output_ids"]) >= 6
    server.wait_idle_baseline()


@pytest.mark.parametrize("keyword, schema", [("uniqueItems", TAGS), ("not", {"type": "integer", "not": {"const": 1}}),
                                             ("if", {"type": "integer", "if": {"minimum": 2}, "then": {"maximum": 3}})])  # fmt: skip
def test_unenforceable_schema_keywords_are_refused(server, keyword, schema):
    with Bystander(server):
        sp = {"json_schema": json.dumps(schema), "max_new_tokens": 10}
        refused(server.post("/generate", {"text": "json", "sampling_params": sp}), keyword)
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        refused(server.post("/v1/chat/completions", {**CHAT, "response_format": rf}), keyword)
        params = {"type": "object", "properties": {"v": schema}}
        tool = {"type": "function", "function": {"name": "f", "parameters": params}}
        refused(server.post("/v1/chat/completions", {**CHAT, "tools": [tool]}), keyword)
    server.wait_idle_baseline()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "ping"}}])
def test_forced_tool_call_fills_tool_calls_without_a_parser(server, choice):
    assert server.get("/get_server_info").json()["tool_call_parser"] is None
    with Bystander(server):
        # Greedy, no thinking budget: the grammar lets a turn think or write text before its call, and
        # with random weights a sampled preamble can outlast max_tokens (about 1 run in 10 did).
        body = {**CHAT, "max_tokens": 60, "temperature": 0, "tools": [TOOL], "tool_choice": choice,
                "reasoning_effort": "none"}
        r = server.post("/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        assert c["finish_reason"] == "tool_calls", c
        calls = c["message"]["tool_calls"]
        assert calls and calls[0]["function"]["name"] == "ping"
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), TOOL["function"]["parameters"])
        assert "ping" not in (c["message"]["content"] or "")
    server.wait_idle_baseline()
