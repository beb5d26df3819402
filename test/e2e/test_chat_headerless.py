"""Issue 18 item 12: the README's chat example. With no tools declared the model's header-less text
is content from its first token (it used to be held back as a possible tool name and dropped at the
length limit, answering "content": "")."""

from __future__ import annotations

import json

README_CHAT = {"model": "inkling-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16,
               "temperature": 0, "logprobs": True}  # fmt: skip


def test_readme_chat_example_answers_its_text(server):
    r = server.post("/v1/chat/completions", README_CHAT)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    # Every sampled token that is ordinary text is visible, in order, from the first one on.
    tokens = [t["token"] for t in choice["logprobs"]["content"]]
    assert tokens and choice["message"]["content"].startswith(tokens[0].split("<|")[0]), (tokens, choice)
    assert choice["message"]["content"], choice
    # The stream says the same, as it goes.
    with server.post("/v1/chat/completions", {**README_CHAT, "stream": True}, stream=True) as s:
        deltas = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith(b"data: {")]
    streamed = "".join(d["choices"][0]["delta"].get("content") or "" for d in deltas if d["choices"])
    assert streamed == choice["message"]["content"]
    server.wait_idle_baseline()
