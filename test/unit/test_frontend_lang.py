"""The frontend interpreter against a scripted backend: requests, variables, fork, batch, stream."""

from __future__ import annotations

import base64
import re
import threading
import time

import pytest

import sglang as sgl
from sglang.lang.backend.base_backend import BaseBackend, SglServerError
from sglang.lang.choices import greedy_token_selection, token_length_normalized
from sglang.lang.executor import ProgramError


class FakeBackend(BaseBackend):
    """Answers /generate bodies from a script and records them, and how many ran at once."""

    def __init__(self, reply=None, delay: float = 0.0, stream_chunks=None, choice_logprobs=None):
        self.reply = reply or (lambda body: f"<{body['text'][-3:]}>")
        self.delay = delay
        self.stream_chunks = stream_chunks
        self.choice_logprobs = choice_logprobs
        self.bodies: list[dict] = []
        self._lock = threading.Lock()
        self._active = 0
        self.max_active = 0

    def generate(self, body):
        with self._lock:
            self.bodies.append(body)
            self._active += 1
            self.max_active = max(self.max_active, self._active)
        try:
            time.sleep(self.delay)
            if isinstance(body.get("input_ids"), list) and isinstance(body["input_ids"][0], list):
                return self._score(body)
            if "error" in body["sampling_params"].get("stop", []):
                raise SglServerError(400, "scripted refusal")
            text = self.reply(body)
            return {"text": text, "output_ids": [], "meta_info": {"finish_reason": {"type": "length"}}}
        finally:
            with self._lock:
                self._active -= 1

    def _score(self, body):
        out = []
        for i, (ids, start) in enumerate(zip(body["input_ids"], body["logprob_start_len"])):
            values = self.choice_logprobs[i]
            entries = [[values[j % len(values)], t, None] for j, t in enumerate(ids[start:])]
            out.append({"text": "", "output_ids": [], "meta_info": {"input_token_logprobs": entries}})
        return out

    def generate_stream(self, body):
        with self._lock:
            self.bodies.append(body)
        for chunk in self.stream_chunks:
            time.sleep(self.delay)  # lets the reader see each chunk, as with a real server
            yield chunk


@sgl.function
def qa(s, question):
    s += "Q: " + question + "\n"
    s += "A:" + sgl.gen("answer", max_tokens=5, stop="\n")


def test_gen_appends_answer_and_sends_merged_sampling_params():
    backend = FakeBackend(reply=lambda body: " four")
    state = qa.run(question="2+2?", temperature=0.25, top_k=3, backend=backend)
    assert state["answer"] == " four"
    assert state.text() == "Q: 2+2?\nA: four"
    (body,) = backend.bodies
    assert body["text"] == "Q: 2+2?\nA:"
    # gen's own options win; the rest come from run().
    assert body["sampling_params"]["max_new_tokens"] == 5
    assert body["sampling_params"]["stop"] == "\n"
    assert body["sampling_params"]["temperature"] == 0.25
    assert body["sampling_params"]["top_k"] == 3
    assert "return_logprob" not in body


def test_gen_constraints_and_logprob_options_reach_the_request():
    backend = FakeBackend(reply=lambda body: "7")

    @sgl.function
    def prog(s):
        s += "n=" + sgl.gen("a", regex="[0-9]", return_logprob=True, top_logprobs_num=2)
        s += " j=" + sgl.gen("b", json_schema={"type": "object"})
        s += " i=" + sgl.gen_int("c")

    prog.run(backend=backend)
    a, b, c = backend.bodies
    assert a["sampling_params"]["regex"] == "[0-9]"
    assert a["return_logprob"] is True and a["top_logprobs_num"] == 2
    assert b["sampling_params"]["json_schema"] == '{"type": "object"}'  # the server takes JSON text
    int_regex = c["sampling_params"]["regex"]
    assert re.fullmatch(int_regex, "-12") and not re.fullmatch(int_regex, "1.5")
    with pytest.raises(ValueError, match="at most one"):
        sgl.gen("x", regex="a", json_schema={})


def test_expressions_concatenate_with_strings():
    backend = FakeBackend(reply=lambda body: "!")

    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x") + "b" + sgl.gen("y") + "c"

    state = prog.run(backend=backend)
    assert state.text() == "a!b!c"
    assert [b["text"] for b in backend.bodies] == ["a", "a!b"]


def test_server_error_surfaces_from_run_and_reads():
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("v", stop=["error"])

    with pytest.raises(ProgramError, match="scripted refusal"):
        prog.run(backend=FakeBackend())


def test_select_picks_highest_length_normalised_logprob():
    # Choice 0 sums higher (-4 over 1 token... repeated) but choice 1 has the better mean per token.
    backend = FakeBackend(choice_logprobs=[[-2.0], [-0.5, -1.5], [-3.0]])

    @sgl.function
    def prog(s):
        s += "The sky is"
        s += sgl.select("c", choices=[" blue", " a very pale shade of grey", " green"])

    state = prog.run(backend=backend)
    assert state["c"] == " a very pale shade of grey"
    assert state.text() == "The sky is a very pale shade of grey"
    meta = state.get_meta_info("c")
    assert meta["normalized_prompt_logprobs"][1] == pytest.approx(-1.0)
    (body,) = backend.bodies
    assert body["return_logprob"] is True and body["sampling_params"]["max_new_tokens"] == 0
    # Scoring starts right after the prompt's tokens, so each choice is scored on its own tokens.
    for ids, start, entries in zip(
        body["input_ids"], body["logprob_start_len"], meta["input_token_logprobs"]
    ):
        assert len(entries) == len(ids) - start >= 1


def test_choice_methods_on_their_own():
    choices = ["a", "b"]
    tokens = [[(-1.0, 1, None), (-5.0, 2, None)], [(-2.0, 3, None)]]
    normalized = [-3.0, -2.0]
    assert (
        token_length_normalized(
            choices=choices, normalized_prompt_logprobs=normalized, input_token_logprobs=tokens
        ).decision
        == "b"
    )
    # Greedy compares the first token first: -1.0 beats -2.0.
    assert (
        greedy_token_selection(
            choices=choices, normalized_prompt_logprobs=normalized, input_token_logprobs=tokens
        ).decision
        == "a"
    )


def test_fork_branches_run_in_parallel_and_join_gathers_variables():
    backend = FakeBackend(reply=lambda body: body["text"][-1], delay=0.3)

    @sgl.function
    def prog(s):
        s += "start"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f" {i}" + sgl.gen("x")
        forks.join()
        return forks

    t0 = time.monotonic()
    state = prog.run(backend=backend)
    elapsed = time.monotonic() - t0
    assert backend.max_active == 3, "the three branches should be at the server together"
    assert elapsed < 0.8
    assert state["x"] == ["0", "1", "2"]
    assert state.text() == "start"  # gather_variable leaves the parent's text alone
    assert [f.text() for f in state.ret_value] == ["start 00", "start 11", "start 22"]


def test_join_concatenate_and_append():
    backend = FakeBackend(reply=lambda body: "!")

    @sgl.function
    def prog(s):
        s += "P:"
        forks = s.fork(2)
        forks += [" a" + sgl.gen(), " b" + sgl.gen()]
        forks.join(mode="concate_and_append")
        s += " end"

    assert prog.run(backend=backend).text() == "P: a! b! end"


def test_run_batch_keeps_order_and_uses_threads():
    backend = FakeBackend(reply=lambda body: body["text"].split()[1], delay=0.1)
    states = qa.run_batch(
        [{"question": f"q{i}"} for i in range(16)], backend=backend, num_threads=8, progress_bar=True
    )
    assert [s["answer"] for s in states] == [f"q{i}" for i in range(16)]
    assert backend.max_active == 8


def test_streaming_holds_back_a_possible_stop_string():
    # The server trims a matched stop string only at the end; the stream must never show it.
    chunks = [
        {"text": "ab", "output_ids": [], "meta_info": {"finish_reason": None}},
        {"text": "abX", "output_ids": [], "meta_info": {"finish_reason": None}},
        {"text": "ab", "output_ids": [], "meta_info": {"finish_reason": {"type": "stop", "matched": "XY"}}},
    ]

    @sgl.function
    def prog(s):
        s += "go:" + sgl.gen("v", stop="XY")

    state = prog.run(backend=FakeBackend(stream_chunks=chunks, delay=0.15), stream=True)
    pieces = list(state.text_iter("v"))
    assert "".join(pieces) == "ab" and not any("X" in p for p in pieces)
    assert state.text() == "go:ab"


def test_variables_set_by_the_program_and_missing_ones():
    @sgl.function
    def prog(s):
        s["k"] = 42

    state = prog.run(backend=FakeBackend())
    assert state["k"] == 42
    with pytest.raises(KeyError):
        state["nope"]


def test_missing_media_file_and_video_are_clear_errors_and_no_backend_is_explained():
    with pytest.raises(FileNotFoundError, match="cat.png"):
        sgl.image("cat.png")
    with pytest.raises(NotImplementedError, match="video"):
        sgl.video("clip.mp4", 4)
    sgl.set_default_backend(None)
    with pytest.raises(RuntimeError, match="set_default_backend"):
        qa.run(question="x")


def test_function_decorator_forms():
    @sgl.function(num_api_spec_tokens=64)
    def prog(s, a, b):
        s += a + b

    assert prog.num_api_spec_tokens == 64
    assert prog.bind(a="x").run(b="y", backend=FakeBackend()).text() == "xy"
    with pytest.raises(TypeError):
        prog.bind(c=1)


def test_raw_program_media_become_placeholders_and_every_later_request_carries_them(tmp_path):
    wav = tmp_path / "a.wav"
    wav.write_bytes(b"RIFF-fake")

    @sgl.function
    def prog(s):
        s += "See " + sgl.image(b"png-bytes") + " hear " + sgl.audio(str(wav)) + sgl.gen("a", max_tokens=2)
        forks = s.fork(1)
        forks[0] += sgl.image("data:image/jpeg;base64,AAAA") + sgl.gen("b", max_tokens=2)
        forks.join()

    backend = FakeBackend(reply=lambda body: "x")
    prog.run(backend=backend)
    first, second = backend.bodies
    assert first["text"] == "See <|unused_200054|> hear <|unused_200053|>"
    png_url = "data:image/png;base64," + base64.b64encode(b"png-bytes").decode()
    assert first["image_data"] == [png_url]
    [audio_url] = first["audio_data"]  # the MIME type is the platform's guess for .wav
    assert audio_url.startswith("data:audio/") and audio_url.endswith(";base64," + base64.b64encode(b"RIFF-fake").decode())
    # The fork inherits the parent's media and adds its own, in prompt order.
    assert second["text"].endswith("x<|unused_200054|>")
    assert second["image_data"] == [png_url, "data:image/jpeg;base64,AAAA"]
    assert second["audio_data"] == first["audio_data"]
