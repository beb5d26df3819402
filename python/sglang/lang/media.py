"""Images and audio clips of a program: what `sgl.image` / `sgl.audio` hold and how they travel.

The server reads media only from the request (a data URL or base64; local paths are refused unless
it was started with --allowed-local-media-path), so the frontend reads a file itself and sends its
bytes as a data URL. In the prompt each item is ONE placeholder token (ids below, or their text
spellings in a `text` prompt); the server widens it to the item's patch or frame count.
"""

from __future__ import annotations

import base64
import mimetypes
import os
from collections.abc import Sequence
from dataclasses import dataclass

IMAGE_TOKEN_ID = 200054
AUDIO_TOKEN_ID = 200053
TOKEN_IDS = {"image": IMAGE_TOKEN_ID, "audio": AUDIO_TOKEN_ID}
# How a placeholder is spelled in a raw (`text`) prompt; the server recognises these spellings.
PLACEHOLDER_TEXT = {kind: f"<|unused_{tid}|>" for kind, tid in TOKEN_IDS.items()}
_FALLBACK_MIME = {"image": "image/png", "audio": "audio/wav"}


@dataclass(frozen=True)
class Media:
    kind: str  # "image" | "audio"
    url: str  # a data URL


def to_data_url(source: str | bytes | os.PathLike, kind: str) -> str:
    """A data URL from a data URL (kept), raw bytes or a local file path (read here)."""
    if isinstance(source, (bytes, bytearray)):
        data, mime = bytes(source), _FALLBACK_MIME[kind]
    elif isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if isinstance(text, str) and text.startswith("data:"):
            return text
        if not os.path.isfile(text):
            raise FileNotFoundError(f"sgl.{kind}: {text!r} is neither a data URL nor an existing file")
        with open(text, "rb") as f:
            data = f.read()
        mime = mimetypes.guess_type(text)[0] or _FALLBACK_MIME[kind]
    else:
        raise TypeError(f"sgl.{kind} takes a file path, a data URL or bytes, got {type(source).__name__}")
    # The server decodes by content, so the MIME type only needs to be plausible.
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def request_fields(media: Sequence[Media]) -> dict[str, list[str]]:
    """`image_data` / `audio_data`: each kind's items in prompt order (the server pairs them with
    that kind's placeholders in order)."""
    out: dict[str, list[str]] = {}
    for kind, field in (("image", "image_data"), ("audio", "audio_data")):
        urls = [m.url for m in media if m.kind == kind]
        if urls:
            out[field] = urls
    return out


def processor():
    """The server's media processor, run here to render chat messages with media exactly as the
    chat endpoint does (imported on first use: it pulls in torch)."""
    from sgl_inkling.multimodal.processor import RequestMediaProcessor

    return RequestMediaProcessor(("image", "audio"), None, IMAGE_TOKEN_ID, AUDIO_TOKEN_ID)


def collapse(ids: list[int], items: Sequence) -> list[int]:
    """Expanded prompt ids (one placeholder per patch/frame) -> one placeholder per item. Uses each
    item's offset and length, so two adjacent items stay two placeholders."""
    out: list[int] = []
    pos = 0
    for item in sorted(items, key=lambda it: it.offset):
        out.extend(ids[pos : item.offset])
        out.append(TOKEN_IDS[item.kind])
        pos = item.offset + item.num_tokens
    out.extend(ids[pos:])
    return out
