"""Output parsing of hand-built TMLv0 model turns, streaming and not.

Sequences are built from text pieces and special tokens through the tokenizer; expected values are
the pieces that went in. Well-formed turns are also checked against tml-renderers' own whole-turn
parser as an independent oracle.
"""

from __future__ import annotations

import json
import random

import pytest
from tml_renderers import chat, v0

from sgl_inkling.chat import REASONING_PARSERS, TOOL_CALL_PARSERS
from sgl_inkling.chat.output_parser import ParsedOutput, parse_output
from sgl_inkling.chat.stream_parser import StreamingOutputParser
from sgl_inkling.chat.tokenizer import get_tokenizer

WEATHER_ARGS = {"city": "San Francisco", "days": [1, 2], "opts": {"unit": "c", "note": 'say "hi" } ]'}}


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


class B:
    """Token-sequence builder: B(tok).think("..").text("..").call(..).end().ids"""

    def __init__(self, tok):
        self.tok, self.ids = tok, []

    def sp(self, name):
        self.ids.append(self.tok.token_id(f"<|{name}|>"))
        return self

    def t(self, text):
        self.ids += self.tok.encode(text)
        return self

    def think(self, text, header=True):
        return (self.sp("message_model") if header else self).sp("content_thinking").t(text).sp("end_message")

    def text(self, text, header=True):
        return (self.sp("message_model") if header else self).sp("content_text").t(text).sp("end_message")

    def call(self, name, args, header=True, raw=None):
        if header:
            self.sp("message_model")
        payload = raw if raw is not None else json.dumps({"name": name, "args": args})
        return self.t(name).sp("content_invoke_tool_json").t(payload).sp("end_message")

    def end(self):
        return self.sp("content_model_end_sampling")


def stream(tok, ids, chunks=1, **kw):
    """Feed ids in chunks; reassemble deltas into (content, reasoning, calls) plus the raw deltas."""
    p = StreamingOutputParser(tok, **kw)
    deltas = []
    for i in range(0, len(ids), chunks):
        deltas += p.feed(ids[i : i + chunks])
    deltas += p.finish()
    content, reasoning, calls = "", "", {}
    for d in deltas:
        set_fields = [d.content is not None, d.reasoning_content is not None, bool(d.tool_calls)]
        assert sum(set_fields) == 1, d
        content += d.content or ""
        reasoning += d.reasoning_content or ""
        for tc in d.tool_calls:
            if tc.index not in calls:
                assert tc.id and tc.id.startswith("call_") and tc.name, "first delta names the call"
                calls[tc.index] = {"id": tc.id, "name": tc.name, "arguments": ""}
            else:
                assert tc.id is None and tc.name is None
            calls[tc.index]["arguments"] += tc.arguments
    assert sorted(calls) == list(range(len(calls)))
    return content, reasoning or None, [calls[i] for i in sorted(calls)], deltas


def assert_stream_matches(tok, ids, parsed: ParsedOutput, **kw):
    for chunks in (1, 3, len(ids) or 1):
        content, reasoning, calls, _ = stream(tok, ids, chunks, **kw)
        assert content == parsed.content
        assert reasoning == parsed.reasoning_content
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
            (c.name, json.loads(c.arguments)) for c in parsed.tool_calls
        ]


def tml_oracle(tok, ids):
    """tml-renderers' whole-turn parse: (content, reasoning, [(name, args)])."""
    parser = v0.Renderer(tok.tml).render_for_completion([])[1]
    content, reasoning, calls = "", "", []
    for m in parser.parse_tokens(ids):
        c = m.content
        if isinstance(c, chat.Text):
            content += c.text
        elif isinstance(c, chat.Thinking):
            reasoning += c.text
        elif isinstance(c, chat.InvokeTool):
            calls.append((c.name, {a.name: json.loads(a.value) for a in c.args}))
    return content, reasoning or None, calls


def check(tok, ids):
    parsed = parse_output(ids, tok)
    assert_stream_matches(tok, ids, parsed)
    return parsed


# -- well-formed turns ---------------------------------------------------------------------------


def test_headerless_thinking_then_text(tok):
    ids = B(tok).think("Let me think.", header=False).text("The answer is 4.").end().ids
    out = check(tok, ids)
    assert out.reasoning_content == "Let me think."
    assert out.content == "The answer is 4."
    assert out.tool_calls == []
    assert (out.content, out.reasoning_content, []) == tml_oracle(tok, ids)


def test_headerless_text_only(tok):
    ids = B(tok).text("  Hello,\n world! 🎉 ", header=False).end().ids
    out = check(tok, ids)
    assert out.content == "  Hello,\n world! 🎉 "
    assert out.reasoning_content is None


def test_headed_first_block(tok):
    out = check(tok, B(tok).think("hmm").text("Hi").end().ids)
    assert (out.reasoning_content, out.content) == ("hmm", "Hi")


def test_headerless_tool_call_name_never_in_content(tok):
    ids = B(tok).call("get_weather", WEATHER_ARGS, header=False).end().ids
    out = check(tok, ids)
    assert out.content == ""
    assert len(out.tool_calls) == 1
    call = out.tool_calls[0]
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == WEATHER_ARGS
    assert call.id.startswith("call_") and len(call.id) > len("call_")
    content, _, _, deltas = stream(tok, ids)
    assert "get_weather" not in content and all("get_weather" not in (d.content or "") for d in deltas)
    assert tml_oracle(tok, ids)[2] == [("get_weather", WEATHER_ARGS)]


def test_text_after_tool_call_is_kept(tok):
    ids = (
        B(tok)
        .think("Need the weather.", header=False)
        .text("Checking.")
        .call("get_weather", {"city": "SF"})
        .text(" Done.")
        .end()
        .ids
    )
    out = check(tok, ids)
    assert out.reasoning_content == "Need the weather."
    assert out.content == "Checking. Done."
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("get_weather", {"city": "SF"})]
    oracle = tml_oracle(tok, ids)
    assert (out.content, out.reasoning_content) == oracle[:2]


def test_parallel_tool_calls(tok):
    ids = (
        B(tok)
        .call("get_weather", {"city": "Paris"}, header=False)
        .call("get_time", {"tz": "Europe/Paris"})
        .call("noop", {})
        .end()
        .ids
    )
    out = check(tok, ids)
    got = [(c.name, json.loads(c.arguments)) for c in out.tool_calls]
    expected = [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"}), ("noop", {})]
    assert got == expected == tml_oracle(tok, ids)[2]
    assert len({c.id for c in out.tool_calls}) == 3
    assert out.content == ""


def test_arguments_stream_before_the_call_ends(tok):
    ids = B(tok).call("get_weather", WEATHER_ARGS, header=False).end().ids
    end_of_call = ids.index(tok.token_id("end_message"))
    p = StreamingOutputParser(tok)
    early = []
    for t in ids[:end_of_call]:
        early += [tc for d in p.feed([t]) for tc in d.tool_calls]
    assert len(early) >= 3, "arguments should arrive in fragments while the JSON is generated"
    assert early[0].name == "get_weather"
    streamed = "".join(tc.arguments for tc in early)
    assert json.loads(streamed) == WEATHER_ARGS


def test_stream_matches_parse_on_random_chunkings(tok):
    ids = (
        B(tok)
        .think("plan: 日本 🎉", header=False)
        .text("Calling two tools.")
        .call("a_tool", {"x": [1, {"y": None}], "s": '\\"}'})
        .call("b_tool", {"k": True})
        .text("after")
        .end()
        .ids
    )
    parsed = parse_output(ids, tok)
    assert parsed.reasoning_content == "plan: 日本 🎉"
    assert parsed.content == "Calling two tools.after"
    rng = random.Random(0)
    for _ in range(20):
        p, deltas, i = StreamingOutputParser(tok), [], 0
        while i < len(ids):
            n = rng.randint(1, 7)
            deltas += p.feed(ids[i : i + n])
            i += n
        deltas += p.finish()
        assert "".join(d.content or "" for d in deltas) == parsed.content
        assert "".join(d.reasoning_content or "" for d in deltas) == parsed.reasoning_content
        args: dict[int, str] = {}
        for tc in (tc for d in deltas for tc in d.tool_calls):
            args[tc.index] = args.get(tc.index, "") + tc.arguments
        assert [json.loads(args[k]) for k in sorted(args)] == [
            json.loads(c.arguments) for c in parsed.tool_calls
        ]


def test_nothing_after_end_of_turn(tok):
    ids = B(tok).text("first", header=False).end().text("ghost").call("f", {}).ids
    out = check(tok, ids)
    assert out.content == "first" and out.tool_calls == []


def test_options_merge_reasoning_and_skip_tool_parsing(tok):
    ids = B(tok).think("why", header=False).call("f", {"a": 1}).end().ids
    merged = parse_output(ids, tok, separate_reasoning=False)
    assert merged.reasoning_content is None and merged.content == "why"
    assert len(merged.tool_calls) == 1
    raw = parse_output(ids, tok, parse_tool_calls=False)
    assert raw.tool_calls == [] and json.loads(raw.content) == {"name": "f", "args": {"a": 1}}
    assert_stream_matches(tok, ids, raw, parse_tool_calls=False)


# -- malformed, truncated and garbage output ------------------------------------------------------


def test_truncated_mid_json_drops_the_call(tok):
    full = B(tok).text("Let me look.", header=False).call("get_weather", {"city": "Boston"}).ids
    cut = full[: full.index(tok.token_id("content_invoke_tool_json")) + 4]
    out = parse_output(cut, tok)
    assert out.tool_calls == []
    assert out.content == "Let me look."
    content, _, _, _ = stream(tok, cut)  # must not raise either
    assert content == "Let me look."


def test_truncated_inside_tool_name_header_does_not_leak(tok):
    ids = B(tok).text("ok", header=False).sp("message_model").t("get_wea").ids
    out = check(tok, ids)
    assert out.content == "ok" and out.tool_calls == []


def test_truncated_text_is_kept(tok):
    ids = B(tok).sp("content_thinking").t("half a thou").ids
    out = check(tok, ids)
    assert out.reasoning_content == "half a thou" and out.content == ""


def test_invalid_json_call_is_dropped_without_raising(tok):
    ids = (
        B(tok).call("f", None, header=False, raw='{"name": "f", "args": {"a": }').text("still here").end().ids
    )
    out = parse_output(ids, tok)
    assert out.tool_calls == [] and out.content == "still here"


def test_args_that_are_not_an_object_are_not_a_call(tok):
    ids = B(tok).call("f", None, raw='{"name": "f", "args": "x"}').end().ids
    out = check(tok, ids)
    assert out.tool_calls == []


def test_padded_header_name_is_tolerated(tok):
    ids = B(tok).sp("message_model").t(" lookup ").sp("content_invoke_tool_json")
    ids = ids.t('{"name": "lookup", "args": {"q": "x"}}').sp("end_message").end().ids
    out = check(tok, ids)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("lookup", {"q": "x"})]


def test_text_without_content_kind_becomes_content(tok):
    ids = B(tok).t("plain words").end().ids
    out = check(tok, ids)
    assert out.content == "plain words"


def test_split_utf8_and_invalid_ids_inside_text(tok):
    emoji = tok.encode("🎉")
    ids = B(tok).sp("content_text").ids + emoji[:1] + tok.encode("x") + [tok.vocab_size + 7]
    ids += B(tok).sp("end_message").end().ids
    out = check(tok, ids)
    assert out.content.startswith("\ufffd") and "x" in out.content


def test_garbage_never_raises_and_stream_agrees(tok):
    specials = [
        tok.token_id(n)
        for n in (
            "message_model",
            "message_user",
            "content_text",
            "content_thinking",
            "content_invoke_tool_json",
            "content_invoke_tool_text",
            "content_xml",
            "end_message",
            "unused",
            "audio_end",
        )
    ]
    words = tok.encode('get_weather {"name": "get_weather", "args": {"a": [1, "}"]}} 日本🎉 text')
    rng = random.Random(1234)
    for _ in range(150):
        ids = [rng.choice(specials + words + [tok.vocab_size + 1, -3]) for _ in range(rng.randint(0, 40))]
        if rng.random() < 0.5:
            ids.append(tok.token_id("content_model_end_sampling"))
        parsed = parse_output(ids, tok)
        content, reasoning, calls, _ = stream(tok, ids, chunks=rng.randint(1, 5))
        assert (content, reasoning) == (parsed.content, parsed.reasoning_content)
        streamed = [(c["name"], c["arguments"]) for c in calls]
        for c in parsed.tool_calls:  # every final call was streamed identically (phantoms aside)
            assert isinstance(json.loads(c.arguments), dict)
            assert (c.name, c.arguments) in streamed


def test_parser_registries():
    assert "inkling" in REASONING_PARSERS and "inkling" in TOOL_CALL_PARSERS
    assert "qwen3" not in REASONING_PARSERS
    assert REASONING_PARSERS["inkling"] is StreamingOutputParser


def test_without_tools_headerless_text_is_content_from_the_first_token(tok):
    """Issue 18 item 12: cut off by the length limit with no framing at all, text still comes out,
    and streams as it is generated rather than at the end."""
    words = "The capital of France is Paris, a city on the Seine."
    ids = tok.encode(words)
    assert parse_output(ids, tok, tool_headers=False).content == words
    p = StreamingOutputParser(tok, tool_headers=False)
    first = p.feed(ids[:3])
    assert "".join(d.content or "" for d in first) == tok.decode(ids[:3])
    p.feed(ids[3:])
    p.finish()
    assert p.result().content == words
    # With tools declared the same cut-off text may be a tool name's header: held back, then dropped.
    assert parse_output(ids, tok, tool_headers=True).content == ""


def test_without_tools_framed_blocks_still_parse(tok):
    ids = B(tok).think("hmm").text("answer", header=False).end().ids
    out = parse_output(ids, tok, tool_headers=False)
    assert out.reasoning_content == "hmm" and out.content == "answer"
