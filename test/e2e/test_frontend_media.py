"""sgl.image / sgl.audio against the shared inkling-tiny server (which has vision and audio towers).

References are independent of the frontend: the same conversation sent by hand to
/v1/chat/completions, and prompt lengths from the published layout rules (image patches; audio
frames per second).
"""

from __future__ import annotations

import math

import pytest

import sglang as sgl
from test.unit.mm_helpers import clip, data_url, encode_audio, encode_image, picture

PATCH = 40
AUDIO_FRAMES_PER_SECOND = 20


def patches(width: int, height: int) -> int:
    """Small pictures are upscaled x2 on the long edge, then cut into rows x (columns + 1) tokens."""
    w, h = 2 * width, 2 * height
    return math.ceil(h / PATCH) * (w // PATCH + 1)


@pytest.fixture(scope="module")
def backend(server):
    return sgl.RuntimeEndpoint(server.base_url)


@sgl.function
def describe(s, image):
    s += sgl.user(sgl.image(image) + "Describe the picture.")
    s += sgl.assistant(sgl.gen("answer", max_tokens=8, temperature=0))


def test_chat_image_matches_the_chat_endpoint_and_the_patch_layout(server, backend, tmp_path):
    sizes = [(64, 48), (120, 80)]
    prompt_tokens = []
    for i, (w, h) in enumerate(sizes):
        png = encode_image(picture(w, h, seed=10 + i))
        path = tmp_path / f"p{i}.png"
        path.write_bytes(png)  # the frontend reads the file and sends its bytes
        state = describe.run(image=str(path), backend=backend)
        meta = state.get_meta_info("answer")
        ref = server.post(
            "/v1/chat/completions",
            {
                "model": "inkling-tiny",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": data_url(png, "image/png")}},
                            {"type": "text", "text": "Describe the picture."},
                        ],
                    }
                ],
                "max_tokens": 8,
                "temperature": 0,
            },
        )
        assert ref.status_code == 200, ref.text
        ref = ref.json()
        assert meta["prompt_tokens"] == ref["usage"]["prompt_tokens"]
        assert meta["completion_tokens"] == ref["usage"]["completion_tokens"]
        message = ref["choices"][0]["message"]
        assert state["answer"] == (message["content"] or "")
        assert (meta["reasoning_content"] or "") == (message.get("reasoning_content") or "")
        prompt_tokens.append(meta["prompt_tokens"])
    # Same text, different picture sizes: the prompts differ by exactly the patch counts.
    assert prompt_tokens[1] - prompt_tokens[0] == patches(*sizes[1]) - patches(*sizes[0])
    server.wait_idle_baseline()


@sgl.function
def listen(s, clip_bytes):
    s += "Listen: "
    if clip_bytes is not None:
        s += sgl.audio(clip_bytes)
    s += sgl.gen("out", max_tokens=2, temperature=0)


def test_raw_audio_adds_twenty_tokens_per_second(server, backend):
    counts = []
    for seconds in (None, 1.0, 2.0):
        wav = None if seconds is None else encode_audio(clip(seconds, 16_000, seed=3), 16_000)
        state = listen.run(clip_bytes=wav, backend=backend)
        counts.append(state.get_meta_info("out")["prompt_tokens"])
    # The placeholder itself is no token: the server replaces it by the clip's frames.
    assert counts[1] - counts[0] == AUDIO_FRAMES_PER_SECOND
    assert counts[2] - counts[0] == 2 * AUDIO_FRAMES_PER_SECOND
    server.wait_idle_baseline()


@sgl.function
def two_turns(s, image):
    s += sgl.user(sgl.image(image) + "What is it?")
    s += sgl.assistant(sgl.gen("a1", max_tokens=4, temperature=0))
    s += sgl.user("And again:" + sgl.image(image))
    s += sgl.assistant(sgl.gen("a2", max_tokens=4, temperature=0))


def test_same_image_twice_hits_the_prefix_cache_on_a_second_run(server, backend):
    assert server.post("/flush_cache").status_code == 200
    image = data_url(encode_image(picture(80, 80, seed=7)), "image/png")
    first = two_turns.run(image=image, backend=backend)
    second = two_turns.run(image=image, backend=backend)
    assert first.get_meta_info("a1")["cached_tokens"] == 0
    # The cache resumes at request-end checkpoints: the second run's second turn resumes past the
    # whole first turn, picture included (its placeholders are keyed by the picture's content).
    assert second.get_meta_info("a2")["cached_tokens"] >= first.get_meta_info("a1")["prompt_tokens"]
    assert second["a1"] == first["a1"] and second["a2"] == first["a2"]
    server.wait_idle_baseline()


@sgl.function
def color(s, image):
    s += "Picture " + sgl.image(image) + " is" + sgl.select("c", choices=[" red", " blue"])


def test_select_after_an_image_scores_the_choice_tokens(server, backend):
    image = data_url(encode_image(picture(64, 48, seed=8)), "image/png")
    state = color.run(image=image, backend=backend)
    scored = state.get_meta_info("c")["input_token_logprobs"]
    for choice, entries in zip([" red", " blue"], scored):
        # Reference: the whole text scored by hand; a one-token choice is the prompt's last token.
        ref = server.generate(
            text="Picture <|unused_200054|> is" + choice,
            image_data=[image],
            return_logprob=True,
            logprob_start_len=0,
            sampling_params={"max_new_tokens": 0, "temperature": 0},
        )["meta_info"]["input_token_logprobs"][-1]
        assert len(entries) == 1 and entries[0][1] == ref[1]
        assert entries[0][0] == pytest.approx(ref[0], abs=1e-3)
    server.wait_idle_baseline()
