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
    assert resp.usage.prompt_tokens_details.cached_tokens == 0


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
