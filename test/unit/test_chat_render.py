"""Prompt rendering through tml-renderers: framing, tools, reasoning effort, history, errors."""

from __future__ import annotations

import json

import pytest
from tml_renderers import chat, v0

from sgl_inkling.chat.output_parser import parse_output
from sgl_inkling.chat.render import ChatRequestError, render_chat
from sgl_inkling.chat.tokenizer import get_tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
SYS_USER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


def text_of(tok, prompt):
    return tok.decode(prompt.input_ids)


def test_system_and_user_framing(tok):
    prompt = render_chat(SYS_USER)
    text = text_of(tok, prompt)
    assert text.startswith("<|message_system|><|content_text|>You are terse.<|end_message|>")
    assert "<|message_user|><|content_text|>Hi there<|end_message|>" in text
    assert text.index("You are terse.") < text.index("Hi there")
    # Framing tokens are real specials, not text that happens to spell them.
    assert prompt.input_ids.count(tok.token_id("end_message")) == text.count("<|end_message|>")
    assert prompt.input_ids[-1] == tok.token_id("end_message")
    assert tok.token_id("content_model_end_sampling") in prompt.stop_token_ids


def test_prompt_ends_where_the_model_turn_begins(tok):
    """The prompt is exactly the prefix of the trained conversation up to the model's first token."""
    prompt = render_chat(SYS_USER, reasoning_effort=0.2)
    history = [
        chat.Message(chat.Text("You are terse."), chat.Author(chat.AuthorKind.System)),
        chat.Message(chat.ThinkingEffort(200), chat.Author(chat.AuthorKind.System)),
        *chat.MessageList.from_oss_messages(
            [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello."}]
        ).messages,
    ]
    (example,) = v0.Renderer(tok.tml).render_for_sft(history)
    full = [t for s in example.input_token_spans for t in s.span.tokens]
    n = len(prompt.input_ids)
    assert full[:n] == prompt.input_ids
    assert full[n] == tok.token_id("message_model")
    # ...and what the model is trained to generate from there parses back to the reply.
    assert parse_output(full[n:], tok).content == "Hello."


def test_reasoning_effort_levels(tok):
    default = text_of(tok, render_chat(SYS_USER))
    assert "Thinking effort level: 0.9<|end_message|>" in default
    for value, shown in [("low", "0.2"), ("medium", "0.7"), ("none", "0"), ("max", "0.99"), (0.5, "0.5")]:
        text = text_of(tok, render_chat(SYS_USER, reasoning_effort=value))
        assert f"Thinking effort level: {shown}<|end_message|>" in text
    # The effort message sits after the system prompt and before the user turn.
    assert (
        default.index("You are terse.") < default.index("Thinking effort level") < default.index("Hi there")
    )
    assert render_chat(SYS_USER, reasoning_effort="low").input_ids != render_chat(SYS_USER).input_ids
    assert render_chat(SYS_USER, reasoning_effort="high").reasoning_effort == 0.9


def test_chat_template_kwargs_effort_and_thinking_switch(tok):
    kw = render_chat(SYS_USER, reasoning_effort="high", chat_template_kwargs={"reasoning_effort": 0.1})
    assert "Thinking effort level: 0.1<|end_message|>" in text_of(tok, kw)
    off = render_chat(SYS_USER, chat_template_kwargs={"enable_thinking": False})
    assert off.reasoning_effort == 0.0
    assert "Thinking effort level: 0<|end_message|>" in text_of(tok, off)


def test_tools_are_declared_before_the_conversation(tok):
    prompt = render_chat(SYS_USER, [WEATHER_TOOL])
    text = text_of(tok, prompt)
    assert prompt.tool_names == ("get_weather",)
    for piece in ("get_weather", "Current weather for a city", '"city"', '"required"'):
        assert piece in text
    assert text.index("get_weather") < text.index("Hi there")
    assert len(prompt.input_ids) > len(render_chat(SYS_USER).input_ids)


def test_history_with_tool_call_reasoning_and_result(tok):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should call the tool.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"},
    ]
    text = text_of(tok, render_chat(messages, [WEATHER_TOOL]))
    assert "<|content_thinking|>I should call the tool.<|end_message|>" in text
    assert "<|message_model|>get_weather<|content_invoke_tool_json|>" in text
    call_json = text.split("<|content_invoke_tool_json|>")[1].split("<|end_message|>")[0]
    assert json.loads(call_json) == {"name": "get_weather", "args": {"city": "Paris"}}
    # The tool result is headed by the tool's name, found through tool_call_id.
    assert "<|message_tool|>get_weather<|content_text|>18C, sunny<|end_message|>" in text
    assert "<|content_text|><|end_message|>" not in text  # no empty text block for content=""


def test_developer_role_is_a_system_message(tok):
    text = text_of(
        tok, render_chat([{"role": "developer", "content": "Rules."}, {"role": "user", "content": "x"}])
    )
    assert text.startswith("<|message_system|><|content_text|>Rules.<|end_message|>")


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"messages": []}, "non-empty"),
        ({"messages": ["hello"]}, "object"),
        ({"messages": [{"role": [{}], "content": "hi"}]}, "role"),  # unhashable: was a 500 (schemathesis)
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, "hologram"),
        ({"reasoning_effort": 1.5}, "reasoning_effort"),
        ({"reasoning_effort": -0.1}, "reasoning_effort"),
        ({"reasoning_effort": float("nan")}, "reasoning_effort"),
        ({"reasoning_effort": "turbo"}, "turbo"),
        ({"reasoning_effort": True}, "reasoning_effort"),
        ({"chat_template_kwargs": {"reasoning_effort": 2}}, "reasoning_effort"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "parameters"),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "duplicate"),
        ({"tools": [{"type": "function", "function": {"name": "two words", "parameters": {}}}]}, "name"),
        ({"tools": [{"type": "retrieval"}]}, "function"),
    ],
)
def test_bad_requests_raise_chat_request_error(kwargs, needle):
    kwargs = {"messages": SYS_USER, **kwargs}
    with pytest.raises(ChatRequestError, match=needle) as info:
        render_chat(**kwargs)
    assert isinstance(info.value, ValueError)


def test_malformed_history_tool_arguments_raise():
    bad = [
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}
    ]
    with pytest.raises(ChatRequestError, match=r"messages\[0\]"):
        render_chat(bad)
