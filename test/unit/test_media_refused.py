"""A server whose checkpoint has no towers (or runs with multimodal input off) refuses media with
a 400-class RequestError that says why, on the native and the chat paths."""

from __future__ import annotations

import pytest

from sgl_inkling.managers.io_struct import RequestError
from sgl_inkling.multimodal import MediaError
from sgl_inkling.multimodal.processor import media_processor

from .mm_helpers import clip, data_url, encode_audio, encode_image, picture

PNG = data_url(encode_image(picture(48, 40, seed=1)), "image/png")
WAV = data_url(encode_audio(clip(0.5, 16000, seed=2), 16000), "audio/wav")


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_text_only_server_refuses_media_on_generate(kind):
    text_only = media_processor(None, {})  # no modalities: what a text-only checkpoint reports
    ids = [1, 2, 200054 if kind == "image" else 200053, 3]
    media = {"image_data": PNG} if kind == "image" else {"audio_data": WAV}
    with pytest.raises(RequestError, match=f"does not accept {kind} input"):
        text_only.expand_request(ids, media.get("image_data"), media.get("audio_data"))


def test_text_only_server_refuses_media_in_chat_and_accepts_text():
    text_only = media_processor(None, {})
    with pytest.raises(MediaError, match="does not accept image input"):  # serving_chat: a 400
        text_only.chat_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}])
    plain = [{"role": "user", "content": "hi"}]
    assert text_only.chat_messages(plain) == (plain, [])


def test_server_with_towers_accepts_the_same_image():
    both = media_processor(None, {"modalities": ["image", "audio"]})
    ids, items = both.expand_request([1, 200054, 2], PNG, None)
    assert len(items) == 1 and len(ids) == 2 + items[0].num_tokens
