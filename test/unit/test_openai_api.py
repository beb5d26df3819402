"""The OpenAI-compatible API layer over a scripted fake engine, through TestClient and the openai client.

The fake TokenizerManager "generates" a fixed TMLv0 token sequence built with the real tokenizer and
yields SGLang-style cumulative outputs. Expected values come from the pieces the script was built
from, from the chat renderer (the prompt oracle) and from the fake's own bookkeeping, never from the
API layer's output.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sgl_inkling.chat import render_chat
from sgl_inkling.chat.tokenizer import get_tokenizer
from sgl_inkling.entrypoints.openai import build_openai_router
from sgl_inkling.managers.io_struct import GenerateReqInput, RequestError
from sgl_inkling.multimodal.processor import media_processor

MODEL = "inkling-test"
USER = [{"role": "user", "content": "What is 2+2?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CACHED = 3


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


class Seq:
    """TMLv0 model-turn builder: Seq(tok).think("..").text("..").call(..).end().ids"""

    def __init__(self, tok):
        self.tok, self.ids = tok, []

    def sp(self, name):
        self.ids.append(self.tok.token_id(name))
        return self

    def t(self, text):
        self.ids += self.tok.encode(text)
        return self

    def think(self, text, header=False):
        return (self.sp("message_model") if header else self).sp("content_thinking").t(text).sp("end_message")

    def text(self, text, header=True):
        return (self.sp("message_model") if header else self).sp("content_text").t(text).sp("end_message")

    def call(self, name, args, header=True):
        if header:
            self.sp("message_model")
        payload = json.dumps({"name": name, "args": args})
        return self.t(name).sp("content_invoke_tool_json").t(payload).sp("end_message")

    def end(self):
        return self.sp("content_model_end_sampling")


def fake_logprob(k: int) -> float:
    return -0.125 * (k + 1)


class FakeTM:
    """Implements the TokenizerManager protocol with a scripted output and real bookkeeping."""

    def __init__(self, tok, script: list[int] | Callable[[GenerateReqInput], list[int]], **kw):
        self.tokenizer = tok
        self.model_name = MODEL
        self.context_len = 4096
        self.reasoning_parser = kw.get("reasoning_parser", "inkling")
        self.tool_call_parser = kw.get("tool_call_parser", "inkling")
        self.enable_cache_report = kw.get("enable_cache_report", True)
        self.script = script
        self.error: RequestError | None = kw.get("error")
        self.error_after: int | None = kw.get("error_after")  # raise after this many streamed outputs
        self.hang_after: int | None = kw.get("hang_after")  # block forever after this many outputs
        self.finish_override: dict | None = kw.get("finish_override")
        self.cancel = kw.get("cancel", False)  # what the real manager does when the client went away
        self.requests: list[GenerateReqInput] = []
        self.aborted: list[str] = []
        self.closed: list[str] = []
        self.media = media_processor(None, {})  # a text-only model: media requests are refused

    def abort_request(self, rid: str) -> None:
        self.aborted.append(rid)

    def _output(self, obj, prompt_ids, out_ids, finish):
        sp = obj.sampling_params or {}
        text = self.tokenizer.decode(out_ids, skip_special_tokens=sp.get("skip_special_tokens", True))
        if finish and isinstance(finish.get("matched"), str):
            text = text[: text.rfind(finish["matched"])]
        meta = {
            "id": obj.rid,
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(out_ids),
            "cached_tokens": min(CACHED, len(prompt_ids)),
            "finish_reason": finish,
            "e2e_latency": 0.01,
        }
        if obj.return_logprob:
            # Texts are left None half the time: the API layer must decode ids itself then.
            def entry(lp, tid):
                return (lp, tid, self.tokenizer.decode([tid]) if tid % 2 else None)

            meta["output_token_logprobs"] = [entry(fake_logprob(k), t) for k, t in enumerate(out_ids)]
            meta["output_top_logprobs"] = [
                [entry(fake_logprob(k) - j, t + j) for j in range(obj.top_logprobs_num)]
                for k, t in enumerate(out_ids)
            ]
            if obj.logprob_start_len == 0:
                meta["input_token_logprobs"] = [
                    (None if i == 0 else -0.5, t, None) for i, t in enumerate(prompt_ids)
                ]
        return {"text": text, "output_ids": list(out_ids), "meta_info": meta}

    async def generate_request(self, obj: GenerateReqInput, request=None):
        assert not obj.is_batch, "the API layer fans out single requests"
        self.requests.append(obj)
        try:
            if self.error is not None:
                raise self.error
            if self.cancel:
                raise asyncio.CancelledError
            prompt_ids = obj.input_ids if obj.input_ids is not None else self.tokenizer.encode(obj.text)
            script = self.script(obj) if callable(self.script) else self.script
            sp = obj.sampling_params or {}
            stops = sp.get("stop") or []
            stops = [stops] if isinstance(stops, str) else stops
            eos = [] if sp.get("ignore_eos") else self.tokenizer.eos_token_ids
            out: list[int] = []
            for k, t in enumerate(script):
                if sp.get("max_new_tokens") is not None and len(out) >= sp["max_new_tokens"]:
                    finish = {"type": "length", "matched": None}
                else:
                    out.append(t)
                    visible = self.tokenizer.decode(out, skip_special_tokens=True)
                    hit = next((s for s in stops if s in visible), None)
                    finish = None
                    if t in eos:
                        finish = {"type": "stop", "matched": t}
                    elif hit is not None:
                        finish = {"type": "stop", "matched": hit}
                    elif k == len(script) - 1:
                        finish = {"type": "length", "matched": None}
                if finish is not None and self.finish_override is not None:
                    finish = self.finish_override
                if obj.stream or finish is not None:
                    yield self._output(obj, prompt_ids, out, finish)
                if finish is not None:
                    return
                if obj.stream and self.error_after is not None and k + 1 >= self.error_after:
                    raise RequestError("engine failed mid-stream", 400)
                if obj.stream and self.hang_after is not None and k + 1 >= self.hang_after:
                    await asyncio.Event().wait()
                await asyncio.sleep(0)  # let concurrent choices interleave
        finally:
            self.closed.append(obj.rid)


class StatusRecorder:
    """ASGI middleware that records every response status (the no-5xx check)."""

    def __init__(self, app):
        self.app, self.statuses = app, []

    async def __call__(self, scope, receive, send):
        async def record(msg):
            if msg["type"] == "http.response.start":
                self.statuses.append(msg["status"])
            await send(msg)

        await self.app(scope, receive, record)


def make_app(tm) -> StatusRecorder:
    app = FastAPI()
    app.include_router(build_openai_router(lambda: tm))
    return StatusRecorder(app)


class Harness:
    def __init__(self, tm):
        self.tm = tm
        self.app = make_app(tm)
        self.http = TestClient(self.app)
        self.client = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=self.http, max_retries=0
        )

    def post(self, path, body):
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return self.http.post(path, content=data, headers={"content-type": "application/json"})


@pytest.fixture
def harness():
    made: list[Harness] = []

    def make(tok, script, **kw) -> Harness:
        h = Harness(FakeTM(tok, script, **kw))
        made.append(h)
        return h

    yield make
    for h in made:
        assert all(s < 500 for s in h.app.statuses), h.app.statuses


def sse_events(resp) -> list:
    """Parse a raw SSE body: JSON payloads, and the final [DONE] marker."""
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in resp.text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def thinking_turn(tok):
    return Seq(tok).think("Let me add.").text("2+2 = 4.").end().ids


# -- /v1/models ------------------------------------------------------------------------------------


def test_models_list_and_retrieve(tok, harness):
    h = harness(tok, [])
    models = h.client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert h.client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        h.client.models.retrieve("other-model")


# -- chat ------------------------------------------------------------------------------------------


def test_chat_nonstream_reasoning_content_usage_and_request(tok, harness):
    script = thinking_turn(tok)
    h = harness(tok, script)
    r = h.client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=50,
        temperature=0.3,
        top_p=0.9,
        stop=["zzz"],
        seed=7,
        extra_body={"top_k": 5, "repetition_penalty": 1.1},
    )
    msg = r.choices[0].message
    assert msg.content == "2+2 = 4."
    assert msg.reasoning_content == "Let me add."
    assert not msg.tool_calls
    assert r.choices[0].finish_reason == "stop"
    assert r.object == "chat.completion" and r.model == MODEL

    prompt_ids = render_chat(USER, tokenizer=tok).input_ids
    (req,) = h.tm.requests
    assert req.input_ids == prompt_ids and req.text is None
    sp = req.sampling_params
    assert sp["max_new_tokens"] == 50 and sp["temperature"] == 0.3 and sp["top_p"] == 0.9
    assert sp["stop"] == ["zzz"] and sp["seed"] == 7 and sp["top_k"] == 5 and sp["repetition_penalty"] == 1.1
    assert "n" not in sp

    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(script)
    assert r.usage.total_tokens == len(prompt_ids) + len(script)
    assert r.usage.prompt_tokens_details.cached_tokens == CACHED


def test_cached_tokens_reported_only_with_enable_cache_report(tok, harness):
    # Upstream's --enable-cache-report: without it the usage carries no prompt_tokens_details.
    h = harness(tok, thinking_turn(tok), enable_cache_report=False)
    r = h.client.chat.completions.create(model=MODEL, messages=USER, max_tokens=50)
    assert r.usage.prompt_tokens_details is None and r.usage.prompt_tokens > CACHED
    c = h.client.completions.create(model=MODEL, prompt="hi there", max_tokens=5)
    assert c.usage.prompt_tokens_details is None
    on = harness(tok, thinking_turn(tok), enable_cache_report=True)
    c = on.client.completions.create(model=MODEL, prompt="hi there", max_tokens=5)
    assert c.usage.prompt_tokens_details.cached_tokens == min(CACHED, c.usage.prompt_tokens)


def test_chat_without_reasoning_parser_keeps_thinking_in_content(tok, harness):
    h = harness(tok, thinking_turn(tok), reasoning_parser=None)
    msg = h.client.chat.completions.create(model=MODEL, messages=USER).choices[0].message
    assert "Let me add." in msg.content and "2+2 = 4." in msg.content
    assert getattr(msg, "reasoning_content", None) is None
    assert "<|" not in msg.content
    # separate_reasoning=false asks for the same even when the server has a parser.
    h2 = harness(tok, thinking_turn(tok))
    body = {"model": MODEL, "messages": USER, "separate_reasoning": False}
    content = h2.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    assert "Let me add." in content and "<|" not in content


def test_chat_reasoning_effort_and_template_kwargs_reach_the_renderer(tok, harness):
    h = harness(tok, thinking_turn(tok))
    h.client.chat.completions.create(model=MODEL, messages=USER, reasoning_effort="low")
    body = {"model": MODEL, "messages": USER, "chat_template_kwargs": {"enable_thinking": False}}
    assert h.post("/v1/chat/completions", body).status_code == 200
    low, off = h.tm.requests
    assert low.input_ids == render_chat(USER, reasoning_effort="low", tokenizer=tok).input_ids
    assert (
        off.input_ids
        == render_chat(USER, chat_template_kwargs={"enable_thinking": False}, tokenizer=tok).input_ids
    )
    assert low.input_ids != off.input_ids != render_chat(USER, tokenizer=tok).input_ids


def reassemble_chat(chunks):
    """Per choice index: role, content, reasoning, tool calls and finish reason from stream chunks."""
    out: dict[int, dict] = {}
    usage = None
    for ch in chunks:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            o = out.setdefault(
                c.index, {"role": None, "content": "", "reasoning": "", "calls": {}, "finish": None}
            )
            d = c.delta
            if d.role:
                assert o["role"] is None and not o["content"], "role comes first, once"
                o["role"] = d.role
            o["content"] += d.content or ""
            o["reasoning"] += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                if tc.index not in o["calls"]:
                    assert tc.id and tc.type == "function" and tc.function.name
                    o["calls"][tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and not tc.function.name
                o["calls"][tc.index]["arguments"] += tc.function.arguments or ""
            if c.finish_reason is not None:
                assert o["finish"] is None
                o["finish"] = c.finish_reason
    return out, usage


def test_chat_stream_reassembles_and_reports_usage(tok, harness):
    script = thinking_turn(tok)
    h = harness(tok, script)
    chunks = list(
        h.client.chat.completions.create(
            model=MODEL, messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    out, usage = reassemble_chat(chunks)
    assert out[0]["role"] == "assistant"
    assert out[0]["content"] == "2+2 = 4."
    assert out[0]["reasoning"] == "Let me add."
    assert out[0]["finish"] == "stop"
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == len(script)
    assert usage.prompt_tokens == len(render_chat(USER, tokenizer=tok).input_ids)
    assert usage.prompt_tokens_details.cached_tokens == CACHED
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    # The fake streamed token by token: the answer must have arrived in several deltas.
    assert sum(1 for ch in chunks for c in ch.choices if c.delta.content) > 1

    raw = h.post("/v1/chat/completions", {"model": MODEL, "messages": USER, "stream": True})
    events = sse_events(raw)
    assert events[-1] == "[DONE]" and all(isinstance(e, dict) for e in events[:-1])
    assert all("usage" not in e or e["usage"] is None for e in events[:-1])


def test_chat_n2_fans_out_distinct_requests(tok, harness):
    script = thinking_turn(tok)
    h = harness(tok, script)
    r = h.client.chat.completions.create(model=MODEL, messages=USER, n=2)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content == "2+2 = 4." for c in r.choices)
    assert len(h.tm.requests) == 2
    rids = {q.rid for q in h.tm.requests}
    assert len(rids) == 2 and all(rids)
    assert h.tm.requests[0].input_ids == h.tm.requests[1].input_ids
    assert r.usage.completion_tokens == 2 * len(script)
    assert r.usage.prompt_tokens == len(h.tm.requests[0].input_ids)

    chunks = list(h.client.chat.completions.create(model=MODEL, messages=USER, n=2, stream=True))
    out, _ = reassemble_chat(chunks)
    assert sorted(out) == [0, 1]
    assert all(o["content"] == "2+2 = 4." and o["finish"] == "stop" for o in out.values())


def weather_turn(tok, header=False):
    return (
        Seq(tok)
        .think("Need the weather.")
        .text("Checking.")
        .call("get_weather", {"city": "Paris", "days": [1, 2]}, header=header)
        .end()
        .ids
    )


@pytest.mark.parametrize("header", [False, True])
def test_chat_tool_calls_nonstream(tok, harness, header):
    script = Seq(tok).call("get_weather", {"city": "Paris"}, header=header).end().ids
    h = harness(tok, script)
    r = h.client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content  # and the tool name never leaks into content
    assert h.tm.requests[0].input_ids == render_chat(USER, tools=[WEATHER_TOOL], tokenizer=tok).input_ids


def test_chat_tool_calls_streamed_with_text_and_reasoning(tok, harness):
    h = harness(tok, weather_turn(tok))
    chunks = list(
        h.client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL], stream=True)
    )
    out, _ = reassemble_chat(chunks)
    o = out[0]
    assert o["reasoning"] == "Need the weather."
    assert o["content"] == "Checking."
    assert [(c["name"], json.loads(c["arguments"])) for c in o["calls"].values()] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]})
    ]
    assert o["finish"] == "tool_calls"
    # Arguments streamed in fragments, not only as one blob at the end.
    arg_deltas = [tc for ch in chunks for c in ch.choices for tc in c.delta.tool_calls or []]
    assert len(arg_deltas) > 1

    r = h.client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL])
    assert r.choices[0].message.content == "Checking."
    assert r.choices[0].message.reasoning_content == "Need the weather."
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {
        "city": "Paris",
        "days": [1, 2],
    }


def test_chat_parallel_tool_calls_false_keeps_first_call(tok, harness):
    script = (
        Seq(tok).call("get_weather", {"city": "A"}, header=False).call("get_weather", {"city": "B"}).end().ids
    )
    h = harness(tok, script)
    both = h.client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL])
    assert [json.loads(c.function.arguments)["city"] for c in both.choices[0].message.tool_calls] == [
        "A",
        "B",
    ]
    one = h.client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL], parallel_tool_calls=False
    )
    assert [json.loads(c.function.arguments)["city"] for c in one.choices[0].message.tool_calls] == ["A"]
    chunks = h.client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL], parallel_tool_calls=False, stream=True
    )
    out, _ = reassemble_chat(list(chunks))
    assert [json.loads(c["arguments"])["city"] for c in out[0]["calls"].values()] == ["A"]


def test_chat_tool_without_parameters_is_accepted(tok, harness):
    h = harness(tok, Seq(tok).call("ping", {}, header=False).end().ids)
    tool = {"type": "function", "function": {"name": "ping"}}
    r = h.client.chat.completions.create(model=MODEL, messages=USER, tools=[tool])
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "ping" and json.loads(call.function.arguments) == {}


def test_chat_tool_choice_none_hides_tools_from_the_prompt(tok, harness):
    h = harness(tok, Seq(tok).text("No tools.", header=False).end().ids)
    r = h.client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL], tool_choice="none")
    assert r.choices[0].message.content == "No tools."
    assert h.tm.requests[0].input_ids == render_chat(USER, tokenizer=tok).input_ids


def test_chat_stop_string_is_trimmed_from_parsed_content(tok, harness):
    h = harness(tok, Seq(tok).text("Hello world. Bye now.", header=False).end().ids)
    r = h.client.chat.completions.create(model=MODEL, messages=USER, stop=["."])
    assert r.choices[0].message.content == "Hello world"
    assert r.choices[0].finish_reason == "stop"
    out, _ = reassemble_chat(
        list(h.client.chat.completions.create(model=MODEL, messages=USER, stop=["."], stream=True))
    )
    assert out[0]["content"] == "Hello world"


def test_chat_without_max_tokens_is_bounded_by_the_context(tok, harness):
    h = harness(tok, thinking_turn(tok))
    h.client.chat.completions.create(model=MODEL, messages=USER)
    prompt_len = len(render_chat(USER, tokenizer=tok).input_ids)
    assert h.tm.requests[0].sampling_params["max_new_tokens"] == h.tm.context_len - prompt_len


def test_chat_length_finish_and_max_completion_tokens(tok, harness):
    script = Seq(tok).text("one two three four five six", header=False).end().ids
    h = harness(tok, script)
    r = h.client.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=4, max_tokens=100)
    assert h.tm.requests[0].sampling_params["max_new_tokens"] == 4
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4
    assert r.choices[0].message.content == tok.decode(script[1:4])


def test_chat_response_format_passes_schema_through(tok, harness):
    h = harness(tok, Seq(tok).text("{}", header=False).end().ids)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    h.client.chat.completions.create(
        model=MODEL,
        messages=USER,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    h.client.chat.completions.create(model=MODEL, messages=USER, response_format={"type": "json_object"})
    h.client.chat.completions.create(model=MODEL, messages=USER, response_format={"type": "text"})
    first, second, third = (q.sampling_params for q in h.tm.requests)
    assert json.loads(first["json_schema"]) == schema
    assert json.loads(second["json_schema"]) == {"type": "object"}
    assert "json_schema" not in third


def test_chat_logprobs_shape_and_stream_agreement(tok, harness):
    script = thinking_turn(tok)
    h = harness(tok, script)
    r = h.client.chat.completions.create(model=MODEL, messages=USER, logprobs=True, top_logprobs=2)
    req = h.tm.requests[0]
    assert req.return_logprob and req.top_logprobs_num == 2
    content = r.choices[0].logprobs.content
    ordinary = [(k, t) for k, t in enumerate(script) if not tok.is_special(t)]
    assert [e.logprob for e in content] == [fake_logprob(k) for k, _ in ordinary]
    assert [bytes(e.bytes) for e in content] == [tok.token_bytes(t) for _, t in ordinary]
    assert all("<|" not in e.token for e in content)
    assert all(len(e.top_logprobs) == 2 for e in content)
    assert [e.top_logprobs[1].logprob for e in content] == [fake_logprob(k) - 1 for k, _ in ordinary]

    chunks = h.client.chat.completions.create(
        model=MODEL, messages=USER, logprobs=True, top_logprobs=2, stream=True
    )
    streamed = [e for ch in chunks for c in ch.choices if c.logprobs for e in c.logprobs.content or []]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


# -- completions -----------------------------------------------------------------------------------


def test_completions_nonstream_text_echo_and_usage(tok, harness):
    script = tok.encode(" four, and that is all.")
    h = harness(tok, script)
    r = h.client.completions.create(model=MODEL, prompt="Two plus two is", max_tokens=100)
    assert r.choices[0].text == " four, and that is all."
    assert r.choices[0].finish_reason == "length"  # the script ran out without an end token
    assert h.tm.requests[0].text == "Two plus two is"
    assert r.usage.prompt_tokens == len(tok.encode("Two plus two is"))
    assert r.usage.completion_tokens == len(script)
    assert r.usage.prompt_tokens_details.cached_tokens == CACHED

    r = h.client.completions.create(model=MODEL, prompt="Two plus two is", echo=True, max_tokens=3)
    assert r.choices[0].text == "Two plus two is" + tok.decode(script[:3])
    assert r.choices[0].finish_reason == "length"


def test_completions_default_max_tokens_is_16(tok, harness):
    h = harness(tok, tok.encode(" word" * 40))
    r = h.post("/v1/completions", {"model": MODEL, "prompt": "x"}).json()
    assert h.tm.requests[0].sampling_params["max_new_tokens"] == 16
    assert r["usage"]["completion_tokens"] == 16


def test_completions_stop_reason_and_matched(tok, harness):
    script = tok.encode(" four") + [tok.token_id("content_model_end_sampling")]
    h = harness(tok, script)
    r = h.post("/v1/completions", {"model": MODEL, "prompt": "2+2="}).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["matched_stop"] == tok.token_id("content_model_end_sampling")
    assert r["choices"][0]["text"] == " four"


def test_completions_prompt_forms_and_n(tok, harness):
    script = tok.encode(" ok")
    h = harness(tok, script)
    ids = tok.encode("token prompt")
    r = h.client.completions.create(model=MODEL, prompt=ids, max_tokens=5)
    assert h.tm.requests[-1].input_ids == ids and h.tm.requests[-1].text is None
    assert r.choices[0].text == " ok"

    h.tm.requests.clear()
    r = h.client.completions.create(model=MODEL, prompt=["first", "second prompt"], n=2, max_tokens=5)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert sorted(q.text for q in h.tm.requests) == ["first", "first", "second prompt", "second prompt"]
    assert len({q.rid for q in h.tm.requests}) == 4
    # Prompt tokens count once per prompt, completions for every choice.
    assert r.usage.prompt_tokens == len(tok.encode("first")) + len(tok.encode("second prompt"))
    assert r.usage.completion_tokens == 4 * len(script)

    h.tm.requests.clear()
    r = h.client.completions.create(model=MODEL, prompt=[ids, ids[:1]], max_tokens=5)
    assert [q.input_ids for q in h.tm.requests] == [ids, ids[:1]]
    assert len(r.choices) == 2


def test_completions_stream(tok, harness):
    script = tok.encode(" four, and that is all.")
    h = harness(tok, script)
    chunks = list(
        h.client.completions.create(
            model=MODEL, prompt="Two plus two is", stream=True, n=2, stream_options={"include_usage": True}
        )
    )
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == {0: " four, and that is all.", 1: " four, and that is all."}
    assert finishes == {0: "length", 1: "length"}
    assert chunks[-1].usage.completion_tokens == 2 * len(script)
    assert sum(1 for ch in chunks for c in ch.choices if c.text) > 2

    events = sse_events(
        h.post("/v1/completions", {"model": MODEL, "prompt": "Hi", "stream": True, "echo": True})
    )
    assert events[-1] == "[DONE]"
    text = "".join(c["text"] for e in events[:-1] for c in e["choices"])
    assert text == "Hi four, and that is all."


def test_completions_logprobs_shape(tok, harness):
    script = tok.encode(" four, and")
    h = harness(tok, script)
    r = h.post(
        "/v1/completions", {"model": MODEL, "prompt": "Two is", "logprobs": 2, "max_tokens": 10}
    ).json()
    lp = r["choices"][0]["logprobs"]
    assert h.tm.requests[0].return_logprob and h.tm.requests[0].top_logprobs_num == 2
    assert lp["tokens"] == [tok.decode([t]) for t in script]
    assert lp["token_logprobs"] == [fake_logprob(k) for k in range(len(script))]
    assert all(len(top) == 2 for top in lp["top_logprobs"])
    assert lp["text_offset"][0] == 0
    assert lp["text_offset"] == [len(tok.decode(script[:k])) for k in range(len(script))]

    # Echo scores the prompt too; offsets run through the echoed prompt.
    r = h.post(
        "/v1/completions", {"model": MODEL, "prompt": "Two is", "logprobs": 1, "echo": True, "max_tokens": 10}
    ).json()
    lp = r["choices"][0]["logprobs"]
    n_prompt = len(tok.encode("Two is"))
    assert h.tm.requests[-1].logprob_start_len == 0
    assert len(lp["tokens"]) == n_prompt + len(script)
    assert lp["token_logprobs"][0] is None
    assert lp["text_offset"][n_prompt] == len("Two is")

    stream = h.post(
        "/v1/completions",
        {"model": MODEL, "prompt": "Two is", "logprobs": 2, "max_tokens": 10, "stream": True},
    )
    streamed = [
        x for e in sse_events(stream)[:-1] for c in e["choices"] for x in c["logprobs"]["token_logprobs"]
    ]
    assert streamed == [fake_logprob(k) for k in range(len(script))]


# -- errors ----------------------------------------------------------------------------------------


def assert_error(resp, status, *needles):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["object"] == "error" and isinstance(body["message"], str) and body["type"]
    for needle in needles:
        assert needle in body["message"], body["message"]
    return body


def test_malformed_json_and_wrong_types_are_400(tok, harness):
    h = harness(tok, [])
    assert_error(h.post("/v1/chat/completions", "{not json"), 400, "JSON")
    assert_error(h.post("/v1/completions", ""), 400)
    assert_error(h.post("/v1/chat/completions", "[1, 2]"), 400)
    body = assert_error(h.post("/v1/chat/completions", {"model": MODEL, "messages": "hi"}), 400, "messages")
    assert body["param"] == "messages"
    assert_error(h.post("/v1/chat/completions", {"messages": USER, "temperature": "hot"}), 400, "temperature")
    assert_error(h.post("/v1/chat/completions", {"messages": USER, "max_tokens": "5"}), 400, "max_tokens")
    assert_error(h.post("/v1/chat/completions", {"messages": USER, "stream": "yes"}), 400, "stream")
    assert_error(h.post("/v1/chat/completions", {"messages": USER, "n": 0}), 400, "n")
    assert_error(h.post("/v1/chat/completions", {"model": MODEL}), 400, "messages")
    assert_error(h.post("/v1/chat/completions", {"messages": USER, "tool_choice": "sometimes"}), 400)
    assert_error(h.post("/v1/chat/completions", {"messages": USER, "top_logprobs": 2}), 400, "logprobs")
    assert_error(
        h.post("/v1/chat/completions", {"messages": USER, "response_format": {"type": "json_schema"}}),
        400,
        "schema",
    )
    named = {"type": "function", "function": {"name": "nope"}}
    assert_error(
        h.post("/v1/chat/completions", {"messages": USER, "tools": [WEATHER_TOOL], "tool_choice": named}),
        400,
        "nope",
    )
    assert_error(h.post("/v1/completions", {"prompt": []}), 400, "prompt")
    assert_error(h.post("/v1/completions", {"prompt": "x", "logprobs": "2"}), 400, "logprobs")
    with pytest.raises(openai.BadRequestError):
        h.client.chat.completions.create(model=MODEL, messages=USER, extra_body={"top_k": "five"})
    assert h.tm.requests == []  # nothing invalid reached the engine


def test_unknown_fields_are_ignored(tok, harness):
    h = harness(tok, thinking_turn(tok))
    body = {"model": MODEL, "messages": USER, "metadata": {"x": 1}, "store": False, "frobnicate": [1]}
    assert h.post("/v1/chat/completions", body).status_code == 200


def test_unknown_model_is_404(tok, harness):
    h = harness(tok, [])
    body = assert_error(h.post("/v1/chat/completions", {"model": "gpt-4o", "messages": USER}), 404, "gpt-4o")
    assert body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        h.client.completions.create(model="gpt-4o", prompt="x")
    assert h.tm.requests == []


def test_bad_message_role_is_400(tok, harness):
    h = harness(tok, [])
    resp = h.post("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]})
    assert_error(resp, 400, "wizard")
    with pytest.raises(openai.BadRequestError):
        h.client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "hi"}])
    assert h.tm.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_request_error_status_and_message_pass_through(tok, harness, stream):
    h = harness(tok, [], error=RequestError("prompt is longer than the context (9000 > 4096)", 413))
    for path, body in (
        ("/v1/chat/completions", {"messages": USER}),
        ("/v1/completions", {"prompt": "x"}),
    ):
        assert_error(h.post(path, {**body, "stream": stream, "n": 2}), 413, "9000 > 4096")
    with pytest.raises(openai.APIStatusError) as e:
        h.client.chat.completions.create(model=MODEL, messages=USER, stream=stream)
    assert e.value.status_code == 413


def test_engine_abort_is_an_error_not_a_success(tok, harness):
    abort = {"type": "abort", "message": "aborted by the scheduler", "matched": None}
    h = harness(tok, tok.encode(" partial output"), finish_override=abort)
    assert_error(h.post("/v1/completions", {"prompt": "x"}), 400, "aborted by the scheduler")
    assert_error(h.post("/v1/chat/completions", {"messages": USER}), 400, "aborted by the scheduler")
    with pytest.raises(openai.APIError, match="aborted by the scheduler"):
        list(h.client.chat.completions.create(model=MODEL, messages=USER, stream=True))


def test_error_mid_stream_is_an_error_event(tok, harness):
    h = harness(tok, tok.encode(" a b c d e f"), error_after=2)
    events = sse_events(h.post("/v1/completions", {"prompt": "x", "stream": True}))
    assert events[-1] == "[DONE]"
    assert "engine failed mid-stream" in events[-2]["error"]["message"]
    with pytest.raises(openai.APIError, match="engine failed mid-stream"):
        list(h.client.chat.completions.create(model=MODEL, messages=USER, stream=True))


def test_engine_cancellation_of_a_nonstream_request_is_not_a_5xx(tok, harness):
    h = harness(tok, [], cancel=True)
    assert_error(h.post("/v1/chat/completions", {"messages": USER, "n": 2}), 499, "cancelled")


# -- disconnect ------------------------------------------------------------------------------------


async def _stream_then_disconnect(app, tm, path: str, body: dict, n_chunks: int, mode: str) -> list[bytes]:
    """Drive the ASGI app directly: send the body, then let the client go away after some chunks.

    mode "message": the server reports an http.disconnect (ASGI spec < 2.4, Starlette cancels the
    stream); mode "send_fails": writing to the closed socket raises OSError (spec 2.4 servers).
    """
    received: list[bytes] = []
    enough = asyncio.Event()
    state = {"sent_body": False}

    async def receive():
        if not state["sent_body"]:
            state["sent_body"] = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await enough.wait()
        return {"type": "http.disconnect"}

    async def send(msg):
        if msg["type"] == "http.response.body" and msg.get("body"):
            if mode == "send_fails" and len(received) >= n_chunks:
                raise OSError("connection reset by peer")
            received.append(msg["body"])
            if len(received) >= n_chunks:
                enough.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4" if mode == "send_fails" else "2.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    try:
        await asyncio.wait_for(app(scope, receive, send), timeout=10)
    except Exception as e:  # Starlette reports the failed send as ClientDisconnect
        assert mode == "send_fails" and type(e).__name__ == "ClientDisconnect", repr(e)
    # Checked before the event loop shuts down (which would close leftover generators anyway).
    tm.aborted_when_app_returned = list(tm.aborted)
    return received


@pytest.mark.parametrize("mode", ["message", "send_fails"])
@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"messages": USER, "stream": True, "n": 2}),
        ("/v1/completions", {"prompt": "x", "stream": True, "n": 2, "max_tokens": 100}),
    ],
)
def test_client_disconnect_aborts_every_choice(tok, path, body, mode):
    script = Seq(tok).text("a b c d e f g h i j", header=False).end().ids
    tm = FakeTM(tok, script, hang_after=3)
    app = make_app(tm)
    received = asyncio.run(_stream_then_disconnect(app, tm, path, body, 3, mode))
    assert received and b"[DONE]" not in b"".join(received)
    rids = [q.rid for q in tm.requests]
    assert len(rids) == 2
    assert sorted(tm.aborted) == sorted(rids)
    assert sorted(tm.aborted_when_app_returned) == sorted(rids)
    assert sorted(tm.closed) == sorted(rids)  # the engine's generators were closed, not left hanging
    assert all(s < 500 for s in app.statuses)


def test_finished_stream_aborts_nothing(tok, harness):
    h = harness(tok, thinking_turn(tok))
    list(h.client.chat.completions.create(model=MODEL, messages=USER, stream=True, n=2))
    assert h.tm.aborted == []
