"""Image and audio prompts: our runtime against the transformers port on inkling-tiny (v3 towers).

The prompts go through the serving path (OpenAI messages -> media decoding -> tml-renderers ->
placeholder expansion); the port gets the same ids with its own placeholder merge (masked_scatter)
and its own towers, and both decode greedily.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from sgl_inkling.model_executor.model_loader import load_model
from sgl_inkling.multimodal.embed import extend_input_embeds
from sgl_inkling.multimodal.image import patchify
from sgl_inkling.multimodal.processor import MediaProcessor

from .helpers import seq_runner
from .mm_helpers import clip, data_url, encode_audio, encode_image, picture

IMAGE_ID, AUDIO_ID = 200054, 200053
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def mm_model(tiny_path):
    model = load_model(tiny_path, torch.float32, "cpu", progress=False, enable_multimodal=None)
    assert model.modalities == ("image", "audio")
    return model


@pytest.fixture(scope="module")
def media():
    return MediaProcessor(("image", "audio"), None, IMAGE_ID, AUDIO_ID)


def image_part(w: int, h: int, seed: int, fmt: str = "PNG") -> dict:
    mime = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}[fmt]
    return {"type": "image_url", "image_url": {"url": data_url(encode_image(picture(w, h, seed), fmt), mime)}}


def audio_part(seconds: float, rate: int, seed: int, fmt: str = "WAV") -> dict:
    wave = clip(seconds, rate, seed, channels=2)
    return {"type": "input_audio", "input_audio": {"data": data_url(encode_audio(wave, rate, fmt), "x/y").split(",")[1], "format": fmt.lower()}}


def prompt(media: MediaProcessor, parts: list[dict]):
    from sgl_inkling.chat import render_chat

    messages, images = media.chat_messages([{"role": "user", "content": parts}])
    rendered = render_chat(messages, reasoning_effort=0.0, allow_media=True)
    return media.expand_chat(rendered.spans, images)


def ours_greedy(model, ids: list[int], items) -> list[int]:
    runner = seq_runner(model)
    seq = runner.new_seq()
    try:
        req = SimpleNamespace(mm_items=items, mm_embeds={})
        embeds = extend_input_embeds(model, [(req, 0, len(ids))], torch.tensor(ids))
        out = runner.step([seq], [ids], input_embeds=embeds)
        tokens: list[int] = []
        while True:
            tokens.append(int(out.logits[-1].argmax()))
            if len(tokens) == NEW_TOKENS:
                return tokens
            out = runner.step([seq], [[tokens[-1]]])
    finally:
        runner.free(seq)


def port_greedy(hf_model, ids: list[int], items) -> list[int]:
    images = [patchify(i.data) for i in items if i.kind == "image"]
    clips = [i.data.long() for i in items if i.kind == "audio"]
    kwargs = {}
    if images:
        kwargs["pixel_values"] = torch.cat(images)
    if clips:
        assert len(clips) == 1
        kwargs["audio_input_ids"] = clips[0][None]
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=torch.tensor([ids]),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            **kwargs,
        )
    return out[0, len(ids) :].tolist()


def expected_patches(w: int, h: int) -> int:
    """The layout rule, written from INKLING.md: long edge x2 (cap 2048), rows ceil(H/40), columns floor(W/40)+1."""
    long_edge = max(w, h)
    ratio = min(2 * long_edge, max(2048, long_edge)) / long_edge
    w2, h2 = math.floor(w * ratio + 0.5), math.floor(h * ratio + 0.5)
    return math.ceil(h2 / 40) * (w2 // 40 + 1)


@pytest.mark.parametrize(
    "sizes",
    [[(90, 50)], [(64, 64), (37, 81)]],
    ids=["one-image", "two-images"],
)
def test_image_prompts_greedy_match_port(mm_model, hf_model, media, sizes):
    parts = [{"type": "text", "text": "Describe:"}]
    parts += [image_part(w, h, seed=i, fmt="PNG" if i % 2 == 0 else "WEBP") for i, (w, h) in enumerate(sizes)]
    ids, items = prompt(media, parts)
    assert [i.num_tokens for i in items] == [expected_patches(w, h) for w, h in sizes]
    assert ids.count(IMAGE_ID) == sum(expected_patches(w, h) for w, h in sizes)
    assert ours_greedy(mm_model, ids, items) == port_greedy(hf_model, ids, items)


def test_audio_prompt_greedy_matches_port(mm_model, hf_model, media):
    # 44.1 kHz stereo FLAC: decoded, mixed to mono, resampled to 16 kHz; 1.5 s -> 30 frames.
    ids, items = prompt(media, [{"type": "text", "text": "Transcribe:"}, audio_part(1.5, 44_100, seed=3, fmt="FLAC")])
    assert [i.kind for i in items] == ["audio"]
    assert ids.count(AUDIO_ID) == items[0].num_tokens == 30
    assert ours_greedy(mm_model, ids, items) == port_greedy(hf_model, ids, items)


def test_media_text_prefix_is_unchanged(mm_model, media):
    """Logits before the first placeholder equal the text-only model's (media only touches its rows)."""
    ids, items = prompt(media, [{"type": "text", "text": "Look"}, image_part(40, 40, seed=9)])
    first = items[0].offset
    runner = seq_runner(mm_model)
    seq = runner.new_seq()
    req = SimpleNamespace(mm_items=items, mm_embeds={})
    embeds = extend_input_embeds(mm_model, [(req, 0, len(ids))], torch.tensor(ids))
    with_media = runner.step([seq], [ids], all_logits=True, input_embeds=embeds).logits
    runner.free(seq)
    seq = runner.new_seq()
    text_only = runner.step([seq], [ids], all_logits=True).logits
    runner.free(seq)
    assert torch.equal(with_media[:first], text_only[:first])
    assert not torch.allclose(with_media[first:], text_only[first:])
