"""/v1/responses over the scripted fake engine, through the openai client's Responses API.

Expected values come from the pieces the script was built from and from the chat renderer (what
prompt the equivalent chat conversation renders to), never from the endpoint's own output.
"""

from __future__ import annotations

import json

import openai
import pytest

from sgl_inkling.chat import render_chat
from sgl_inkling.entrypoints.openai.serving_responses import ResponseStore

from .test_openai_api import (
    CACHED,
    MODEL,
    USER,
    WEATHER_TOOL,
    FakeTM,
    Harness,
    Seq,
    thinking_turn,
    tok,
    weather_turn,
)

__all__ = ["tok"]  # the fixture, imported for this module's tests

TOOL = {"type": "function", **WEATHER_TOOL["function"]}  # Responses tools are flat


def test_plain_response_items_usage_and_prompt(tok):
    h = Harness(FakeTM(tok, thinking_turn(tok)))
    r = h.client.responses.create(model=MODEL, input="What is 2+2?", instructions="Be brief.", max_output_tokens=50)
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert [item.type for item in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Let me add."
    assert r.output_text == "2+2 = 4."
    (req,) = h.tm.requests
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    assert req.input_ids == render_chat(messages, tokenizer=tok).input_ids
    assert req.sampling_params["max_new_tokens"] == 50
    assert r.usage.input_tokens == len(req.input_ids) and r.usage.output_tokens == len(thinking_turn(tok))
    assert r.usage.input_tokens_details.cached_tokens == CACHED
    assert r.usage.output_tokens_details.reasoning_tokens == len(tok.encode("Let me add."))


def test_length_cut_is_incomplete(tok):
    h = Harness(FakeTM(tok, Seq(tok).text("a long answer").ids))  # no end token: runs out of budget
    r = h.client.responses.create(model=MODEL, input="hi")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_function_call_items_and_tool_choice(tok):
    h = Harness(FakeTM(tok, weather_turn(tok)))
    r = h.client.responses.create(model=MODEL, input="Weather?", tools=[TOOL], tool_choice="required")
    assert [item.type for item in r.output] == ["reasoning", "message", "function_call"]
    call = r.output[2]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris", "days": [1, 2]}
    assert call.call_id and call.id.startswith("fc_")
    (req,) = h.tm.requests
    chat_tool = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
    assert req.input_ids == render_chat([{"role": "user", "content": "Weather?"}], [chat_tool], tokenizer=tok).input_ids
    assert req.grammar is not None  # the chat path's TMLv0 tool grammar constrains the call

    # The tool result goes back as function_call_output on top of the stored response.
    h.tm.script = Seq(tok).text("Sunny.").end().ids
    r2 = h.client.responses.create(
        model=MODEL, previous_response_id=r.id, tools=[TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )  # fmt: skip
    assert r2.output_text == "Sunny." and r2.previous_response_id == r.id
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Need the weather.",
         "tool_calls": [{"id": call.call_id, "type": "function",
                         "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
    ]  # fmt: skip
    assert h.tm.requests[1].input_ids == render_chat(history, [chat_tool], tokenizer=tok).input_ids


def test_input_items_match_the_chat_conversation(tok):
    h = Harness(FakeTM(tok, thinking_turn(tok)))
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Greet."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "What is 2+2?"},
    ]
    h.client.responses.create(model=MODEL, input=items)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet."}, *USER]  # fmt: skip
    assert h.tm.requests[0].input_ids == render_chat(chat, tokenizer=tok).input_ids


def test_stream_events_reassemble_to_the_response(tok):
    h = Harness(FakeTM(tok, weather_turn(tok)))
    events = list(h.client.responses.create(model=MODEL, input="Weather?", tools=[TOOL], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert (thinking, text, json.loads(args)) == ("Need the weather.", "Checking.", {"city": "Paris", "days": [1, 2]})
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert added == [d.type for d in done] == ["reasoning", "message", "function_call"]
    final = events[-1].response
    assert [o.id for o in final.output] == [d.id for d in done]  # the stream's items are the response's
    assert final.output_text == "Checking." and json.loads(final.output[2].arguments) == json.loads(args)
    assert h.client.responses.retrieve(final.id).output_text == "Checking."


def test_refusals_are_400s(tok):
    h = Harness(FakeTM(tok, thinking_turn(tok)))
    bad = [
        {"input": "x", "tools": [{"type": "web_search"}]},
        {"input": "x", "previous_response_id": "resp_missing"},
        {"input": "x", "background": True},
        {"input": "x", "truncation": "auto"},
        {"input": "x", "include": ["reasoning.encrypted_content"]},
        {"input": [{"type": "item_reference", "id": "x"}]},
        {"input": "x", "tool_choice": "required"},
        {"input": "x", "reasoning": {"summary": "detailed"}},
        {"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}},
    ]
    for body in bad:
        with pytest.raises(openai.BadRequestError):
            h.client.responses.create(model=MODEL, **body)
    with pytest.raises(openai.NotFoundError):
        h.client.responses.retrieve("resp_missing")
    assert h.tm.requests == []


def test_store_keeps_the_newest():
    store = ResponseStore(capacity=2)
    for i in range(3):
        store.put({"id": f"r{i}"}, [])
    assert store.get("r0") is None and store.get("r1") is not None and store.get("r2") is not None
