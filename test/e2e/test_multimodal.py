"""Image and audio input through the server: OpenAI chat parts, native /generate fields, the prefix
cache keyed by media content, and bad media answered with a 400 while the server keeps serving."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest

from test.unit.mm_helpers import clip, data_url, encode_audio, encode_image, picture

IMAGE_ID = 200054
GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


def png(w: int, h: int, seed: int) -> str:
    return data_url(encode_image(picture(w, h, seed)), "image/png")


def chat(server, parts: list[dict]):
    return server.post(
        "/v1/chat/completions",
        {"model": "inkling-tiny", "messages": [{"role": "user", "content": parts}], "max_tokens": 4,
         "temperature": 0},
    )


def gen_image(server, image: str) -> dict:
    # /generate: one placeholder token per image, widened by the server to its patch count.
    return server.generate(input_ids=[200000, 200005, IMAGE_ID, 200010], image_data=[image], sampling_params=GREEDY)


def test_chat_with_image_and_audio(server):
    wav = base64.b64encode(encode_audio(clip(1.0, 16_000, seed=1), 16_000)).decode()
    r = chat(server, [{"type": "text", "text": "What is this?"},
                      {"type": "image_url", "image_url": {"url": png(90, 50, seed=1)}},
                      {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}])
    assert r.status_code == 200, r.text
    text_only = chat(server, [{"type": "text", "text": "What is this?"}]).json()["usage"]["prompt_tokens"]
    # 90x50 -> 180x100: 3 rows x 5 columns; 1 s of audio -> 20 frames; plus the media framing tokens.
    assert r.json()["usage"]["prompt_tokens"] - text_only >= 15 + 20


def test_generate_text_placeholder_matches_input_ids(server):
    image = png(64, 48, seed=2)
    by_ids = gen_image(server, image)
    by_text = server.generate(text="<|unused_200054|>", image_data=image, sampling_params=GREEDY)
    assert by_ids["meta_info"]["prompt_tokens"] == 3 + 3 * 4  # 128x96: 3 rows x 4 columns
    assert by_text["meta_info"]["prompt_tokens"] == 3 * 4
    server.wait_idle_baseline()


def test_same_image_hits_the_cache_and_a_different_one_does_not(server):
    assert server.post("/flush_cache").status_code == 200
    a, b = png(80, 80, seed=5), png(80, 80, seed=6)  # same size: the same placeholder ids
    first = gen_image(server, a)
    n = first["meta_info"]["prompt_tokens"]
    assert first["meta_info"]["cached_tokens"] == 0
    # A second turn over the same picture resumes after the whole first turn (its end checkpoint)...
    turn2 = [200000, 200005, IMAGE_ID, 200010] + [t for t in first["output_ids"] if t != IMAGE_ID] + [200010]
    again = server.generate(input_ids=turn2, image_data=[a], sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] >= n
    # ...while the same turn over a different picture of the same size reuses at most the text
    # before the picture: its placeholder keys carry the other content's hash.
    other = server.generate(input_ids=turn2, image_data=[b], sampling_params=GREEDY)
    assert other["meta_info"]["cached_tokens"] <= 2
    server.wait_idle_baseline()


def _huge_png_header() -> bytes:
    """A valid PNG header claiming 100000 x 100000 pixels (refused before any pixel is decoded)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def _gif() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="GIF")
    return buf.getvalue()


@pytest.mark.parametrize(
    "part, needle",
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(encode_image(picture(20, 20, 1))[:60]).decode()}}, "cannot decode image"),
        ({"type": "image_url", "image_url": {"url": data_url(_gif(), "image/gif")}}, "unsupported image format"),
        ({"type": "image_url", "image_url": {"url": data_url(_huge_png_header(), "image/png")}}, "too large"),
        ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "remote media"),
        ({"type": "image_url", "image_url": {"url": "/etc/passwd"}}, "not allowed"),
        ({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF0000WAVEjunk").decode(), "format": "wav"}}, "cannot decode audio"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}}, "unsupported audio format"),
    ],
    ids=["corrupt-png", "gif", "too-large", "remote-url", "local-path", "corrupt-wav", "ogg"],
)
def test_bad_media_is_a_400(server, part, needle):
    r = chat(server, [{"type": "text", "text": "hi"}, part])
    assert r.status_code == 400, r.text
    assert needle in r.json()["message"] if "message" in r.json() else needle in r.json()["error"]["message"]


def test_bad_generate_media_is_a_400_and_server_keeps_serving(server):
    r = server.post("/generate", {"input_ids": [1, 2, 3], "image_data": [png(40, 40, 1)]})
    assert r.status_code == 400 and "placeholder" in r.text
    r = server.post("/generate", {"input_ids": [1, IMAGE_ID], "image_data": "http://x/y.png"})
    assert r.status_code == 400 and "remote media" in r.text
    assert gen_image(server, png(40, 40, seed=3))["meta_info"]["prompt_tokens"] > 4
    server.wait_idle_baseline()
