"""Grammar-constrained decoding against a real inkling-tiny server (random weights: the model has no
idea what JSON is, so every valid output is the grammar's doing).

Schemas are nested but bounded (maxLength, maxItems, enums, ranged numbers) so that a model with no
preference finishes well inside max_tokens; finish_reason must then be "stop", never "length".
Requests run concurrently (one batch) and mostly greedy (sampling costs as much as the tiny model's
forward on the CPU); each request has its own prompt, so outputs still differ. Greedy rows, like
seeded ones, decode the same tokens whatever else is in the batch, which is what lets a streamed
request be compared with its non-streamed twin.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from sgl_inkling.chat import render_chat
from sgl_inkling.chat.tokenizer import get_tokenizer

from .server import ServerProcess

MODEL = "inkling-tiny"
# Short keys and names on purpose: a random model spells fixed strings a character at a time, so key
# length is most of the decode time here; the structure (nesting, arrays, enums, bounded numbers,
# required fields) is what the tests are about.
PLACE = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "geo": {
            "type": "object",
            "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}},
            "required": ["lat"],
        },
    },
    "required": ["city"],
}
TOOL_PARAMS = {
    "weather": {
        "type": "object",
        "properties": {"at": PLACE, "unit": {"enum": ["c", "f"]}},
        "required": ["at", "unit"],
    },
    "event": {
        "type": "object",
        "properties": {
            "who": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
            "prio": {"type": "integer", "minimum": 1, "maximum": 5},
            "pub": {"type": "boolean"},
        },
        "required": ["prio"],
    },
    "ping": {"type": "object", "properties": {}},
}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in TOOL_PARAMS.items()]
RECORD = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "nm": {"type": "string", "maxLength": 5},
        "st": {"enum": ["on", "off"]},
        "tg": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "ad": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{3}$"}, "ok": {"type": "boolean"}},
            "required": ["zip"],
        },
    },
    "required": ["id", "st", "ad"],
}
REGEXES = [
    r"[A-Z]{2}-[0-9]{3}",
    r"(yes|no|maybe)",
    r"[a-z]{1,6}@[a-z]{1,5}\.(com|org)",
    r"-?[0-9]{1,4}\.[0-9]{2}",
]


@pytest.fixture(scope="module")
def gserver(tiny_path):
    s = ServerProcess(
        "--skip-server-warmup", "--tool-call-parser", "inkling", "--reasoning-parser", "inkling"
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(gserver):
    return openai.OpenAI(base_url=gserver.base_url + "/v1", api_key="none", max_retries=0, timeout=600)


def run_all(fn, items):
    with ThreadPoolExecutor(max(1, min(len(items), 100))) as pool:
        return list(pool.map(fn, items))


def user(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Task {i}: use a tool."}]


def check_call(name: str, arguments: str, allowed: set[str]) -> dict:
    assert name in allowed, name
    args = json.loads(arguments)
    jsonschema.validate(args, TOOL_PARAMS[name])
    return args


def stream_calls(client, **kw) -> tuple[list[tuple[str, str]], str | None, str]:
    """Reassemble streamed tool_call deltas: [(name, arguments)], finish_reason, content."""
    calls: dict[int, list[str]] = {}
    finish, content = None, ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, ["", ""])
                slot[0] += tc.function.name or ""
                slot[1] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], finish, content


@pytest.mark.parametrize("choice", ["required", "named"])
def test_tool_choice_100_requests_valid_and_streams_reassemble(client, gserver, choice):
    names = list(TOOL_PARAMS)

    def kwargs(i: int) -> dict:
        tool_choice = (
            "required" if choice == "required" else {"type": "function", "function": {"name": names[i % 3]}}
        )
        return dict(
            model=MODEL,
            messages=user(i),
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            reasoning_effort="none",
            max_tokens=120,
            temperature=0,
        )

    # 100 prompts, each sent plain and streamed; a stream must reassemble to its twin's call.
    whole = run_all(lambda i: client.chat.completions.create(**kwargs(i)), list(range(100)))
    streamed = run_all(lambda i: stream_calls(client, **kwargs(i)), list(range(100)))
    for i, (resp, (s_calls, s_finish, s_content)) in enumerate(zip(whole, streamed)):
        c = resp.choices[0]
        assert c.finish_reason == "tool_calls" and s_finish == "tool_calls", (i, c)
        assert len(c.message.tool_calls) == 1 and not c.message.content and not s_content
        call = c.message.tool_calls[0].function
        allowed = set(names) if choice == "required" else {names[i % 3]}
        args = check_call(call.name, call.arguments, allowed)
        assert len(s_calls) == 1 and s_calls[0][0] == call.name and json.loads(s_calls[0][1]) == args
    gserver.wait_idle_baseline()


def test_parallel_required_calls_all_validate(client):
    tok = get_tokenizer()
    # After each call the grammar allows another call or the end of the turn: bias them about even.
    bias = {tok.token_id("message_model"): 5, tok.token_id("content_model_end_sampling"): 5}

    def one(i: int):
        return client.chat.completions.create(
            model=MODEL,
            messages=user(i),
            tools=TOOLS,
            tool_choice="required",
            reasoning_effort="none",
            max_tokens=240,
            seed=1000 + i,
            logit_bias={str(k): v for k, v in bias.items()},
        )

    counts = []
    for resp in run_all(one, list(range(12))):
        c = resp.choices[0]
        calls = c.message.tool_calls or []
        # Calls have no count limit, so a long run may hit max_tokens; every complete call must validate.
        assert c.finish_reason == "tool_calls" or len(calls) >= 3, c
        for tc in calls:
            check_call(tc.function.name, tc.function.arguments, set(TOOL_PARAMS))
        counts.append(len(calls))
    assert max(counts) > 1, "no request made more than one call"


def test_tool_choice_auto_forced_opening(client):
    """Biasing the model into opening a call (header-less or not): the grammar picks the tool from the
    declared ones only and constrains its arguments; the name never leaks into the content."""
    tok = get_tokenizer()
    names = list(TOOL_PARAMS)

    def one(i: int):
        bias = {
            tok.encode(names[i % 3])[0]: 80,  # open a call to this tool ...
            tok.token_id("message_model"): 60 if i % 2 else 0,  # ... with or without a header
            tok.token_id("content_model_end_sampling"): 100,  # and end the turn after it
        }
        return client.chat.completions.create(
            model=MODEL,
            messages=user(i),
            tools=TOOLS,
            reasoning_effort="none",
            max_tokens=120,
            temperature=0,
            logit_bias={str(k): v for k, v in bias.items()},
        )

    for i, resp in enumerate(run_all(one, list(range(20)))):
        c = resp.choices[0]
        assert c.finish_reason == "tool_calls" and not c.message.content, c
        (tc,) = c.message.tool_calls
        check_call(tc.function.name, tc.function.arguments, {names[i % 3]})


def test_json_schema_100_requests(client, gserver):
    schema_text = json.dumps(RECORD)

    def native(i: int) -> str:
        r = gserver.generate(
            text=f"Record {i} as JSON:",
            sampling_params={
                "json_schema": schema_text,
                "max_new_tokens": 150,
                "temperature": 0,
            },
        )
        assert r["meta_info"]["finish_reason"]["type"] == "stop", r
        return r["text"]  # exactly the JSON: no framing, no stop token

    def chat(i: int) -> str:
        fmt = {
            "type": "json_schema",
            "json_schema": {"name": "record", "schema": RECORD, "strict": i % 2 == 0},
        }
        resp = client.chat.completions.create(
            model=MODEL,
            messages=user(i),
            response_format=fmt,
            reasoning_effort="none",
            max_tokens=150,
            temperature=0,
        )
        assert resp.choices[0].finish_reason == "stop", resp
        return resp.choices[0].message.content

    texts = run_all(native, list(range(50))) + run_all(chat, list(range(50)))
    for text in texts:
        jsonschema.validate(json.loads(text), RECORD)
    assert len(set(texts)) > 50


def test_structured_output_after_reasoning(client):
    """Reasoning on: the model thinks (forced open, closed at once by a bias), then the grammar must
    take over for the answer: the end of reasoning is the token, not a re-encoded spelling."""
    tok = get_tokenizer()
    bias = {tok.token_id("content_thinking"): 90, tok.token_id("end_message"): 100}
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD}}

    def one(i: int):
        return client.chat.completions.create(
            model=MODEL,
            messages=user(i),
            response_format=fmt,
            reasoning_effort="high",
            max_tokens=150,
            temperature=0,
            logit_bias={str(k): v for k, v in bias.items()},
        )

    for resp in run_all(one, list(range(8))):
        c = resp.choices[0]
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), RECORD)


def test_regex_50_requests(client, gserver):
    def native(i: int) -> tuple[str, str]:
        pattern = REGEXES[i % len(REGEXES)]
        r = gserver.generate(
            text=f"Item {i}:", sampling_params={"regex": pattern, "max_new_tokens": 40, "temperature": 0}
        )
        assert r["meta_info"]["finish_reason"]["type"] == "stop", r
        return pattern, r["text"]

    def chat(i: int) -> tuple[str, str]:
        pattern = REGEXES[i % len(REGEXES)]
        resp = client.chat.completions.create(
            model=MODEL,
            messages=user(i),
            reasoning_effort="none",
            max_tokens=40,
            temperature=0,
            extra_body={"regex": pattern},
        )
        assert resp.choices[0].finish_reason == "stop", resp
        return pattern, resp.choices[0].message.content

    for pattern, text in run_all(native, list(range(25))) + run_all(chat, list(range(25))):
        assert re.fullmatch(pattern, text), (pattern, text)


def test_ebnf_and_json_object(client, gserver):
    ebnf = 'root ::= "(" num ("," num){0,2} ")"\nnum ::= [1-9] [0-9]?'
    out = run_all(
        lambda i: gserver.generate(
            text="Tuple:", sampling_params={"ebnf": ebnf, "max_new_tokens": 30, "seed": i}
        ),
        list(range(8)),
    )
    for r in out:
        assert r["meta_info"]["finish_reason"]["type"] == "stop"
        assert re.fullmatch(r"\([1-9][0-9]?(,[1-9][0-9]?){0,2}\)", r["text"]), r["text"]
    # Any JSON object: the grammar frames it; a bias picks the shortest so the random model finishes.
    tok = get_tokenizer()
    resp = client.chat.completions.create(
        model=MODEL,
        messages=user(0),
        response_format={"type": "json_object"},
        reasoning_effort="none",
        max_tokens=20,
        logit_bias={str(tok.encode("{}")[0]): 100},
    )
    assert resp.choices[0].finish_reason == "stop" and json.loads(resp.choices[0].message.content) == {}


@pytest.mark.parametrize(
    "path,body,message",
    [
        ("/generate", {"text": "x", "sampling_params": {"json_schema": '{"type": "objekt"}'}}, "JSON schema"),
        ("/generate", {"text": "x", "sampling_params": {"json_schema": "{oops"}}, "not valid JSON"),
        ("/generate", {"text": "x", "sampling_params": {"regex": "[a-"}}, "invalid regex"),
        ("/generate", {"text": "x", "sampling_params": {"ebnf": "root ::= (("}}, "invalid EBNF"),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "nope",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            },
            "object",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": 1}},
                },
            },
            "schema",
        ),
        ("/v1/completions", {"prompt": "x", "regex": "(("}, "invalid regex"),
    ],
)
def test_bad_grammars_are_400_and_the_server_keeps_serving(gserver, path, body, message):
    r = gserver.post(path, body)
    assert r.status_code == 400, r.text
    assert message in r.json()["message"]
    ok = gserver.generate(text="x", sampling_params={"regex": "[0-9]{2}", "max_new_tokens": 8})
    assert re.fullmatch("[0-9]{2}", ok["text"])


def test_responses_tool_calls_take_the_chat_grammar_path(client):
    """/v1/responses with tools: the same TMLv0 tool grammar as chat, so the call is schema-valid and
    identical to the chat endpoint's for the same greedy request, plain or streamed."""
    flat = [{"type": "function", "name": n, "parameters": p} for n, p in TOOL_PARAMS.items()]
    common = {"model": MODEL, "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0}
    r = client.responses.create(input=user(7), tools=flat, reasoning={"effort": "none"}, max_output_tokens=120,
                                **common)  # fmt: skip
    chat = client.chat.completions.create(messages=user(7), tools=TOOLS, reasoning_effort="none", max_tokens=120,
                                          **common)  # fmt: skip
    (call,) = [item for item in r.output if item.type == "function_call"]
    check_call(call.name, call.arguments, set(TOOL_PARAMS))
    expected = chat.choices[0].message.tool_calls[0].function
    assert (call.name, call.arguments) == (expected.name, expected.arguments)
    events = list(client.responses.create(input=user(7), tools=flat, reasoning={"effort": "none"},
                                          max_output_tokens=120, stream=True, **common))  # fmt: skip
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == call.arguments
    # The result goes back on top of the stored response: the prompt is the whole conversation.
    follow = client.responses.create(
        model=MODEL, previous_response_id=r.id, max_output_tokens=8, temperature=0, tools=flat,
        reasoning={"effort": "none"}, input=[{"type": "function_call_output", "call_id": call.call_id, "output": "done"}],
    )  # fmt: skip
    history = user(7) + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "done"},
    ]  # fmt: skip
    assert follow.previous_response_id == r.id
    assert follow.usage.input_tokens == len(render_chat(history, TOOLS, "none").input_ids)
