"""/generate against a real server: greedy equals transformers, logprobs, streaming, batches."""

from __future__ import annotations

import json

import pytest
import requests
import torch

from test.unit.helpers import random_prompt

GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_greedy_over_http_equals_transformers_generate(server, hf_model, seed):
    prompt = random_prompt(10 + 7 * seed, seed=500 + seed)
    out = server.generate(input_ids=prompt, sampling_params=GREEDY)
    with torch.no_grad():
        ref = hf_model.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=24,
            min_new_tokens=24,
            do_sample=False,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert out["output_ids"] == ref
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == 24
    assert meta["finish_reason"]["type"] == "length"


def test_logprobs_are_the_reference_log_softmax(server, hf_model):
    prompt = random_prompt(15, seed=77)
    out = server.generate(
        input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 5},
        return_logprob=True, top_logprobs_num=3, logprob_start_len=0,
    )  # fmt: skip
    meta = out["meta_info"]
    full = prompt + out["output_ids"]
    with torch.no_grad():
        lp = torch.log_softmax(hf_model(input_ids=torch.tensor([full])).logits[0].double(), -1)
    for i, (value, tok, _) in enumerate(meta["output_token_logprobs"]):
        assert tok == out["output_ids"][i]
        assert value == pytest.approx(lp[len(prompt) - 1 + i, tok].item(), abs=1e-4)
        top = meta["output_top_logprobs"][i]
        ref_top = torch.topk(lp[len(prompt) - 1 + i], 3)
        assert [t for _, t, _ in top] == ref_top.indices.tolist()
    inputs = meta["input_token_logprobs"]
    assert inputs[0][0] is None and [t for _, t, _ in inputs] == prompt
    for j in range(1, len(prompt)):
        assert inputs[j][0] == pytest.approx(lp[j - 1, prompt[j]].item(), abs=1e-4)


def test_text_prompt_batch_and_stop_strings(server):
    tok_text = "Hello there"
    single = server.generate(text=tok_text, sampling_params=GREEDY)
    batch = server.generate(text=[tok_text, "Other prompt"], sampling_params=GREEDY)
    assert isinstance(batch, list) and batch[0]["output_ids"] == single["output_ids"]
    # Stop at a string that greedy decoding is known to produce: a piece of the free-running text.
    target = single["text"][5:9]
    assert target.strip(), "the greedy text should give a non-blank stop string"
    stopped = server.generate(text=tok_text, sampling_params={**GREEDY, "stop": target})
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert target not in stopped["text"] and single["text"].startswith(stopped["text"])


def test_stop_token_ids_and_eos(server):
    single = server.generate(input_ids=random_prompt(9, seed=9), sampling_params=GREEDY)
    stop_at = single["output_ids"][3]
    out = server.generate(
        input_ids=random_prompt(9, seed=9), sampling_params={**GREEDY, "stop_token_ids": [stop_at]}
    )
    first = single["output_ids"].index(stop_at)
    assert out["output_ids"] == single["output_ids"][: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}


def test_stream_chunks_are_cumulative_and_end_with_the_full_answer(server):
    body = {"input_ids": random_prompt(12, seed=12), "sampling_params": GREEDY}
    whole = server.generate(**body)
    r = requests.post(server.base_url + "/generate", json={**body, "stream": True}, stream=True, timeout=120)
    chunks = [
        json.loads(line[6:]) for line in (b.decode() for b in r.iter_lines()) if line and line != "data: [DONE]"
    ]
    assert len(chunks) >= 2
    for a, b in zip(chunks, chunks[1:]):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
    assert chunks[-1]["output_ids"] == whole["output_ids"] and chunks[-1]["text"] == whole["text"]


def test_seeded_sampling_is_reproducible(server):
    body = {
        "input_ids": random_prompt(8, seed=8),
        "sampling_params": {"temperature": 1.0, "seed": 42, "max_new_tokens": 12},
    }
    a, b = server.generate(**body), server.generate(**body)
    assert a["output_ids"] == b["output_ids"]
    c = server.generate(**{**body, "sampling_params": {**body["sampling_params"], "seed": 43}})
    assert c["output_ids"] != a["output_ids"]


def test_info_endpoints(server):
    info = server.get("/get_model_info").json()
    assert info["is_generation"] and info["served_model_name"] == "inkling-tiny"
    assert server.get("/health").status_code == 200
    assert server.get("/metrics").status_code == 404  # served only with --enable-metrics (test_metrics_and_flags)
    assert server.post("/flush_cache").status_code == 200
    server.wait_idle_baseline()
