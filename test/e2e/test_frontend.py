"""The frontend language against a real inkling-tiny server, started by `sgl.Runtime`.

Every expectation is computed independently, with raw HTTP calls to /generate (and, for chat, the
project's renderer and output parser), never taken from the frontend's own output.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import requests

import sglang as sgl
from sgl_inkling.chat.output_parser import parse_output
from sgl_inkling.chat.render import render_chat
from sgl_inkling.chat.tokenizer import get_tokenizer
from sglang.lang.backend.base_backend import SglServerError
from sglang.lang.executor import ProgramError

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def runtime(tiny_path):
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the server's torch threads; 2-core CI machines
    try:
        rt = sgl.Runtime(log_level="warning", skip_server_warmup=True, launch_timeout=240)
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    yield rt
    process = rt.process
    rt.shutdown()
    assert process.poll() is not None, "Runtime.shutdown() left the server running"


@pytest.fixture(scope="module")
def endpoint(runtime):
    return sgl.RuntimeEndpoint(runtime.url)


def raw_generate(url: str, **body) -> dict | list:
    r = requests.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def greedy(n: int = MAX_TOKENS, **extra) -> dict:
    return {"max_new_tokens": n, "temperature": 0, **extra}


# ---------------------------------------------------------------------------------------- programs

EXAMPLES = "Q: What is the capital of France?\nA: Paris\n\nQ: What is 3 + 4?\nA: 7\n\n"


@sgl.function
def few_shot_qa(s, question, stop=None):
    s += "Q: What is the capital of France?\nA: Paris\n\n"
    s += "Q: What is 3 + 4?\nA: 7\n\n"
    s += "Q: " + question + "\n"
    s += "A:" + sgl.gen("answer", max_tokens=MAX_TOKENS, stop=stop)


@sgl.function
def multi_turn(s):
    s += sgl.system("You answer in one word.")
    s += sgl.user("Name a colour.")
    s += sgl.assistant(sgl.gen("a1", max_tokens=MAX_TOKENS))
    s += sgl.user("Another one?")
    s += sgl.assistant_begin()
    s += "Sure,"
    s += sgl.gen("a2", max_tokens=MAX_TOKENS)
    s += sgl.assistant_end()


@sgl.function
def three_ideas(s):
    s += "Three ideas:"
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += f" Idea {i}:" + sgl.gen("idea", max_tokens=4)
    forks.join()
    return [f.text() for f in forks]


# ------------------------------------------------------------------------------------------- tests


def test_few_shot_qa(endpoint):
    prompt = EXAMPLES + "Q: Who wrote Hamlet?\nA:"
    expected = raw_generate(endpoint.base_url, text=prompt, sampling_params=greedy())["text"]
    state = few_shot_qa.run(question="Who wrote Hamlet?", temperature=0, backend=endpoint)
    assert state["answer"] == expected
    assert state.text() == prompt + expected
    assert state.get_meta_info("answer")["completion_tokens"] == MAX_TOKENS

    # A stop string taken from the unconstrained answer must cut the answer right before it.
    spots = [
        i
        for i in range(1, len(expected) - 2)
        if expected[i : i + 2].isascii() and expected[i : i + 2].strip()
    ]
    assert spots, f"no usable stop string in {expected!r}"
    stop = expected[spots[len(spots) // 2] : spots[len(spots) // 2] + 2]
    stopped = few_shot_qa.run(question="Who wrote Hamlet?", stop=stop, temperature=0, backend=endpoint)
    assert stopped["answer"] == expected[: expected.index(stop)]


def test_multi_turn_chat(endpoint):
    tok = get_tokenizer()
    url = endpoint.base_url
    history = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour."},
    ]
    # Turn 1: the rendered conversation; the model opens its turn; visible text is the answer.
    out1 = raw_generate(url, input_ids=render_chat(history).input_ids, sampling_params=greedy())
    answer1 = parse_output(out1["output_ids"], tool_headers=False).content  # no tools: header-less text is text
    history += [{"role": "assistant", "content": answer1}, {"role": "user", "content": "Another one?"}]
    # Turn 2: continue the assistant's text block after "Sure," (closing framing removed).
    ids2 = render_chat([*history, {"role": "assistant", "content": "Sure,"}]).input_ids
    assert ids2[-2:] == [tok.token_id("end_message"), tok.token_id("content_model_end_sampling")]
    out2 = raw_generate(url, input_ids=ids2[:-2], sampling_params=greedy())
    answer2 = parse_output([tok.token_id("content_text"), *out2["output_ids"]], tool_headers=False).content

    state = multi_turn.run(temperature=0, backend=endpoint)
    assert state["a1"] == answer1
    assert state["a2"] == answer2
    assert answer2, "continuing a text block should give visible text"
    assert state.messages() == [*history, {"role": "assistant", "content": "Sure," + answer2}]
    assert state.get_meta_info("a2")["prompt_tokens"] == len(ids2) - 2
    assert state.text() == tok.decode(render_chat(state.messages()).input_ids)


def choice_scores(url: str, prompt_ids_of, choices: list[str]) -> list[float]:
    """Mean logprob of each choice's own tokens, from /generate with logprob_start_len=0."""
    scores = []
    for choice in choices:
        prompt_ids, full_ids = prompt_ids_of(""), prompt_ids_of(choice)
        # The choice's tokens start where prompt+choice stops agreeing with the prompt alone.
        k = 0
        while k < len(prompt_ids) and full_ids[k] == prompt_ids[k]:
            k += 1
        out = raw_generate(
            url, input_ids=full_ids, sampling_params=greedy(0), return_logprob=True, logprob_start_len=0
        )
        entries = out["meta_info"]["input_token_logprobs"]
        assert [e[1] for e in entries] == full_ids
        own = [e[0] for e in entries[k:]]
        scores.append(sum(own) / len(own))
    return scores


def test_select_picks_the_highest_normalised_logprob(endpoint):
    tok = get_tokenizer()
    choices = [" Paris", " London", " a small village by the sea"]

    @sgl.function
    def pick(s):
        s += "The capital of France is"
        s += sgl.select("city", choices=choices)

    scores = choice_scores(endpoint.base_url, lambda c: tok.encode("The capital of France is" + c), choices)
    state = pick.run(backend=endpoint)
    best = max(range(len(choices)), key=scores.__getitem__)
    assert state["city"] == choices[best]
    assert state.get_meta_info("city")["normalized_prompt_logprobs"] == pytest.approx(scores, abs=1e-4)
    assert state.text() == "The capital of France is" + choices[best]
    # Again, now that every choice is in the server's prefix cache: the scores must not change.
    again = pick.run(backend=endpoint)
    assert again.get_meta_info("city")["normalized_prompt_logprobs"] == pytest.approx(scores, abs=1e-4)

    # The same inside an assistant message: choices continue its text block.
    colours = ["red", "blue", "a deep green"]

    @sgl.function
    def pick_chat(s):
        s += sgl.user("Pick a colour.")
        s += sgl.assistant(sgl.select("colour", choices=colours))

    def chat_ids(choice: str) -> list[int]:
        ids = render_chat(
            [{"role": "user", "content": "Pick a colour."}, {"role": "assistant", "content": choice}]
        ).input_ids
        return ids[:-2]  # open after the text: no <|end_message|>, no end of turn

    scores = choice_scores(endpoint.base_url, chat_ids, colours)
    state = pick_chat.run(backend=endpoint)
    assert state["colour"] == colours[max(range(len(colours)), key=scores.__getitem__)]
    assert state.get_meta_info("colour")["normalized_prompt_logprobs"] == pytest.approx(scores, abs=1e-4)


def run_unwrapping_server_errors(program, **kw):
    try:
        return program.run(**kw)
    except ProgramError as e:
        if isinstance(e.__cause__, SglServerError):
            raise e.__cause__ from None
        raise


def test_regex_constrained_gen(endpoint):
    @sgl.function
    def code(s):
        s += "The three-digit code is " + sgl.gen("code", regex=r"[0-9]{3}", max_tokens=8)

    state = run_unwrapping_server_errors(code, temperature=0, backend=endpoint)
    assert re.fullmatch(r"[0-9]{3}", state["code"]), state["code"]


def test_json_schema_constrained_gen(endpoint):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}, "bright": {"type": "boolean"}},
        "required": ["colour", "bright"],
        "additionalProperties": False,
    }

    @sgl.function
    def describe(s):
        s += "A colour as JSON: " + sgl.gen("obj", json_schema=schema, max_tokens=48)

    state = run_unwrapping_server_errors(describe, temperature=0, backend=endpoint)
    jsonschema.validate(json.loads(state["obj"]), schema)


def test_fork_into_three_branches(endpoint):
    prompts = [f"Three ideas: Idea {i}:" for i in range(3)]
    expected = [o["text"] for o in raw_generate(endpoint.base_url, text=prompts, sampling_params=greedy(4))]
    state = three_ideas.run(temperature=0, backend=endpoint)
    assert state["idea"] == expected
    assert state.ret_value == [p + e for p, e in zip(prompts, expected)]
    assert state.text() == "Three ideas:"


def test_run_batch_of_16_with_threads(endpoint):
    questions = [f"What is {i} + {i}?" for i in range(16)]
    prompts = [EXAMPLES + f"Q: {q}\nA:" for q in questions]
    expected = [o["text"] for o in raw_generate(endpoint.base_url, text=prompts, sampling_params=greedy())]
    assert len(set(expected)) > 1, "the order check needs answers that differ"
    states = few_shot_qa.run_batch(
        [{"question": q} for q in questions],
        temperature=0,
        backend=endpoint,
        num_threads=8,
        progress_bar=True,
    )
    assert [s["answer"] for s in states] == expected


def test_streaming(endpoint):
    whole = few_shot_qa.run(question="Who wrote Hamlet?", temperature=0, backend=endpoint)
    state = few_shot_qa.run(question="Who wrote Hamlet?", temperature=0, backend=endpoint, stream=True)
    chunks = list(state.text_iter())
    assert len(chunks) > 2, "tokens should arrive as they are generated"
    assert "".join(chunks) == whole.text() == state.text()

    state = few_shot_qa.run(question="Who wrote Hamlet?", temperature=0, backend=endpoint, stream=True)
    assert "".join(state.text_iter("answer")) == whole["answer"]

    chat_whole = multi_turn.run(temperature=0, backend=endpoint)
    chat_stream = multi_turn.run(temperature=0, backend=endpoint, stream=True)
    assert "".join(chat_stream.text_iter()) == chat_whole.text()
    assert chat_stream["a2"] == chat_whole["a2"]


def test_runtime_and_runtime_endpoint_agree(runtime, endpoint):
    for program, kwargs in [
        (few_shot_qa, {"question": "Who wrote Hamlet?"}),
        (multi_turn, {}),
        (three_ideas, {}),
    ]:
        via_runtime = program.run(temperature=0, backend=runtime, **kwargs)
        via_endpoint = program.run(temperature=0, backend=endpoint, **kwargs)
        assert via_runtime.text() == via_endpoint.text()
        assert via_runtime.ret_value == via_endpoint.ret_value
    # A Runtime also works as the default backend, as upstream programs use it.
    expected = few_shot_qa.run(question="Who wrote Hamlet?", temperature=0, backend=endpoint).text()
    sgl.set_default_backend(runtime)
    try:
        assert few_shot_qa.run(question="Who wrote Hamlet?", temperature=0).text() == expected
    finally:
        sgl.set_default_backend(None)
