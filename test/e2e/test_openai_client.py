"""The official openai client against a real server: chat, completions, streaming, usage."""

from __future__ import annotations

import openai
import pytest

from sgl_inkling.chat.render import render_chat


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def test_models_list(client):
    assert [m.id for m in client.models.list().data] == ["inkling-tiny"]


def test_chat_completion_usage_counts_the_rendered_prompt(client):
    resp = client.chat.completions.create(model="inkling-tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    prompt_len = len(render_chat(MESSAGES).input_ids)
    assert resp.usage.prompt_tokens == prompt_len
    assert 1 <= resp.usage.completion_tokens <= 12
    assert resp.usage.total_tokens == prompt_len + resp.usage.completion_tokens
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert resp.usage.prompt_tokens_details is None  # cached tokens only with --enable-cache-report


def test_chat_stream_reassembles_to_the_full_answer(client):
    kw = {"model": "inkling-tiny", "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    whole = client.chat.completions.create(**kw).choices[0].message
    content, reasoning, usage = "", "", None
    for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
    assert content == (whole.content or "")
    assert usage is not None and usage.completion_tokens >= 1


def test_completion_and_stream_agree(client, server):
    kw = {"model": "inkling-tiny", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}
    whole = client.completions.create(**kw)
    native = server.generate(text="Once upon a time", sampling_params={"max_new_tokens": 10, "temperature": 0})
    assert whole.choices[0].text == native["text"]
    assert whole.usage.prompt_tokens == native["meta_info"]["prompt_tokens"]
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)
    assert streamed == whole.choices[0].text


def test_n_choices_and_logprobs(client):
    resp = client.chat.completions.create(
        model="inkling-tiny", messages=MESSAGES, max_tokens=6, temperature=1.0, n=2, logprobs=True, top_logprobs=2
    )
    assert len(resp.choices) == 2
    for choice in resp.choices:
        for entry in choice.logprobs.content:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 2


# -- /v1/responses: the same conversation as chat, in the Responses API's shape ------------------


def test_responses_plain_equals_chat(client):
    kw = {"model": "inkling-tiny", "max_output_tokens": 12, "temperature": 0}
    r = client.responses.create(input=MESSAGES[1:], instructions=MESSAGES[0]["content"], **kw)
    chat = client.chat.completions.create(model="inkling-tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    assert r.status in ("completed", "incomplete") and r.output_text == (chat.choices[0].message.content or "")
    assert r.usage.input_tokens == len(render_chat(MESSAGES).input_ids) == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert client.responses.retrieve(r.id).output_text == r.output_text


def test_responses_stream_reassembles(client):
    kw = {"model": "inkling-tiny", "input": "Name a colour.", "max_output_tokens": 16, "temperature": 0}
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == whole.output_text and events[-1].response.output_text == whole.output_text
    assert events[-1].type == ("response.completed" if whole.status == "completed" else "response.incomplete")
