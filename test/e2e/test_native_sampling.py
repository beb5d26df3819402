"""SGLang's sampling params on /generate that this server used to refuse or ignore: stop_regex,
first-occurrence stop trimming, no_stop_trim, structural_tag, stream_interval, custom_params,
spaces_between_special_tokens; and /openapi.json declaring the body. Expected texts come from the
Hugging Face tokenizer (an independent decoder) applied to the returned ids, with upstream's rules."""

from __future__ import annotations

import json
import re

import pytest
import requests
from transformers import AutoTokenizer

from test.unit.helpers import random_prompt

GREEDY = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
PROMPT = random_prompt(12, seed=21)


@pytest.fixture(scope="module")
def hf(server):
    return AutoTokenizer.from_pretrained(server.get("/get_model_info").json()["tokenizer_path"])


@pytest.fixture(scope="module")
def free_text(server):
    return server.generate(input_ids=PROMPT, sampling_params=GREEDY)


def _stream(server, body) -> list[dict]:
    r = requests.post(server.base_url + "/generate", json={**body, "stream": True}, stream=True, timeout=120)
    assert r.status_code == 200, r.text
    return [json.loads(x[6:]) for x in (b.decode() for b in r.iter_lines()) if x and x != "data: [DONE]"]


def test_stop_regex_stops_where_the_pattern_first_matches(server, hf, free_text):
    text = free_text["text"]
    k = next(i for i in range(5, len(text) - 3) if text[i : i + 3].isalnum())
    pattern = "".join(f"[{c}]" for c in text[k : k + 3])  # matches that text; its source does not occur
    out = server.generate(input_ids=PROMPT, sampling_params={**GREEDY, "stop_regex": [r"\d{99}", pattern]})
    ids = out["output_ids"]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert ids == free_text["output_ids"][: len(ids)]
    assert re.search(pattern, hf.decode(ids)) and not re.search(pattern, hf.decode(ids[:-1]))
    assert out["text"] == hf.decode(ids)  # as upstream: a pattern's match stays in the text


def test_stop_strings_trim_at_their_first_occurrence(server, hf, free_text):
    text = free_text["text"]
    for stop in sorted({c for c in text if c.strip()}, key=text.index)[:4] + [" "]:
        for no_trim in (False, True):
            sp = {**GREEDY, "stop": stop, "no_stop_trim": no_trim}
            out = server.generate(input_ids=PROMPT, sampling_params=sp)
            full = hf.decode(out["output_ids"])
            assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
            cut = full.find(stop)
            assert out["text"] == (full[: cut + len(stop)] if no_trim else full[:cut]), (stop, no_trim)


def test_structural_tag_constrains_the_output(server):
    tag = {"type": "structural_tag", "format": {"type": "regex", "pattern": "(yes|no)-[0-9]{2}"}}
    out = server.generate(
        input_ids=PROMPT, sampling_params={"temperature": 0, "max_new_tokens": 20, "structural_tag": json.dumps(tag)}
    )
    assert re.fullmatch("(yes|no)-[0-9]{2}", out["text"]), out["text"]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    legacy = {"type": "structural_tag", "triggers": ["<f>"],
              "structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}]}  # fmt: skip
    sp = {"temperature": 0, "max_new_tokens": 4, "structural_tag": json.dumps(legacy)}
    assert server.post("/generate", {"input_ids": PROMPT, "sampling_params": sp}).status_code == 200
    for bad in ("{not json", json.dumps({"type": "structural_tag", "format": {"type": "nope"}})):
        r = server.post("/generate", {"input_ids": PROMPT, "sampling_params": {"structural_tag": bad}})
        assert r.status_code == 400 and "structural_tag" in r.json()["message"]
    both = {"structural_tag": json.dumps(tag), "regex": "a"}
    r = server.post("/generate", {"input_ids": PROMPT, "sampling_params": both})
    assert r.status_code == 400 and "structural_tag" in r.json()["message"]


def test_stream_interval_spaces_the_chunks(server, free_text):
    body = {"input_ids": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 13, "stream_interval": 4}}
    chunks = _stream(server, body)
    lens = [len(c["output_ids"]) for c in chunks]
    assert lens[-1] == 13 and chunks[-1]["output_ids"] == free_text["output_ids"][:13]
    assert all(b - a >= 4 for a, b in zip(lens, lens[1:-1])), lens
    assert len(chunks) <= 1 + 13 // 4 + 1
    every = _stream(server, {**body, "sampling_params": {**body["sampling_params"], "stream_interval": 1}})
    assert len(every) > len(chunks)


def test_special_token_text_matches_the_reference_decoder(server, hf):
    special = hf.convert_tokens_to_ids("<|content_text|>")
    for spaces in (True, False):
        sp = {**GREEDY, "max_new_tokens": 3, "logit_bias": {str(special): 100}, "skip_special_tokens": False,
              "spaces_between_special_tokens": spaces, "custom_params": {"any": [1, "x"]}}  # fmt: skip
        out = server.generate(input_ids=PROMPT, sampling_params=sp)
        assert out["output_ids"] == [special] * 3
        want = hf.decode(out["output_ids"], skip_special_tokens=False, spaces_between_special_tokens=spaces)
        assert out["text"] == want


def test_openapi_declares_the_generate_body(server):
    spec = server.get("/openapi.json").json()
    body = spec["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    schemas = spec["components"]["schemas"]
    model = schemas[body["$ref"].rsplit("/", 1)[1]]
    assert {"text", "input_ids", "sampling_params", "rid", "stream"} <= set(model["properties"])
    assert "mm_items" not in model["properties"] and model["additionalProperties"] is False
    assert {"stop_regex", "structural_tag", "stream_interval", "n"} <= set(schemas["NativeSamplingParams"]["properties"])
    server.wait_idle_baseline()


def test_a_matched_stop_token_is_trimmed_from_the_text(server, hf, free_text):
    stop_at = free_text["output_ids"][4]
    for no_trim in (False, True):
        sp = {**GREEDY, "stop_token_ids": [stop_at], "no_stop_trim": no_trim}
        out = server.generate(input_ids=PROMPT, sampling_params=sp)
        ids = out["output_ids"]
        assert ids[-1] == stop_at and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
        assert out["text"] == hf.decode(ids if no_trim else ids[:-1])  # upstream decodes the ids less the stop


def test_streamed_text_never_shows_a_stop_string(server, free_text):
    text = free_text["text"]
    stop = text[6:14]  # spans several tokens: its start is streamed before the whole of it is known
    sp = {**GREEDY, "stop": stop}
    whole = server.generate(input_ids=PROMPT, sampling_params=sp)
    chunks = _stream(server, {"input_ids": PROMPT, "sampling_params": {**sp, "stream_interval": 1}})
    texts = [c["text"] for c in chunks]
    assert texts[-1] == whole["text"] == text[: text.find(stop)]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts  # cumulative, never taken back
