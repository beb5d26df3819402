"""Request-side media handling (HTTP process): load, validate and preprocess each image or clip, and
lay its placeholder tokens into the prompt. Every failure is a MediaError (a 400)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sgl_inkling.multimodal import audio as audio_mod
from sgl_inkling.multimodal import image as image_mod
from sgl_inkling.multimodal.errors import MediaError
from sgl_inkling.multimodal.fetch import load_bytes
from sgl_inkling.multimodal.items import MediaItem

_NAMES = {"image": "image (vision)", "audio": "audio"}


class MediaProcessor:
    def __init__(
        self,
        modalities: Sequence[str],
        allowed_local_path: str | None,
        image_token_id: int,
        audio_token_id: int,
    ):
        self.modalities = tuple(modalities)
        self.allowed_local_path = allowed_local_path
        self.token_ids = {"image": image_token_id, "audio": audio_token_id}

    def _check_enabled(self, kind: str) -> None:
        if kind not in self.modalities:
            raise MediaError(
                f"this server does not accept {kind} input: the model has no {_NAMES[kind]} encoder "
                "(or multimodal input is off)"
            )

    # ---------------------------------------------------------------- one item

    def image(self, source: Any) -> MediaItem:
        self._check_enabled("image")
        data, _ = load_bytes(source, self.allowed_local_path)
        pixels = torch.from_numpy(image_mod.decode_image(data))
        return MediaItem("image", pixels, image_mod.num_patches(pixels.shape[1], pixels.shape[0]))

    def audio_wave(self, source: Any):
        self._check_enabled("audio")
        data, _ = load_bytes(source, self.allowed_local_path)
        return audio_mod.decode_audio(data)

    def audio(self, source: Any) -> MediaItem:
        bins = audio_mod.dmel_bins(self.audio_wave(source))
        return MediaItem("audio", bins, bins.shape[0])

    # ---------------------------------------------------------------- chat (OpenAI messages)

    def chat_messages(self, messages: Sequence[Any]) -> tuple[list[Any], list[MediaItem]]:
        """Messages whose image and audio parts tml-renderers can render without fetching anything,
        and the decoded images in order. An image part becomes a pointer with the upscaled size (so
        the renderer counts its patches); an audio part becomes a 16 kHz WAV (the renderer dMel-
        encodes it)."""
        out, images = [], []
        for i, msg in enumerate(messages):
            content = msg.get("content") if isinstance(msg, dict) else None
            if not isinstance(content, list):
                out.append(msg)
                continue
            parts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                where = f"messages[{i}].content[{j}]"
                if kind == "image_url":
                    item = self.image(_url(part, "image_url", where))
                    images.append(item)
                    h, w = item.data.shape[:2]
                    url = f"sgl-media:{len(images) - 1}"
                    part = {"type": "image_url", "image_url": {"url": url, "width": w, "height": h}}
                elif kind in ("input_audio", "audio_url"):
                    if kind == "input_audio":
                        spec = part.get("input_audio")
                        if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
                            raise MediaError(f"{where}: input_audio needs a base64 'data' string")
                        fmt = spec.get("format")
                        if fmt is not None and str(fmt).lower() not in audio_mod.FORMATS.values():
                            raise MediaError(f"{where}: unsupported audio format {fmt!r}; use wav, flac or mp3")
                        source = spec["data"]
                    else:
                        source = _url(part, "audio_url", where)
                    wave = self.audio_wave(source)
                    part = {"type": "input_audio", "input_audio": {"data": audio_mod.wav16k_base64(wave), "format": "wav"}}
                parts.append(part)
            out.append(dict(msg, content=parts))
        return out, images

    def expand_chat(self, spans: Sequence[Any], images: list[MediaItem]) -> tuple[list[int], list[MediaItem]]:
        """Rendered spans -> prompt ids with one placeholder per patch or audio frame, and the items."""
        from tml_renderers import chat

        ids: list[int] = []
        items: list[MediaItem] = []
        pending = iter(images)
        for s in spans:
            span = s.span
            if isinstance(span, chat.EncodedTextTokenSpan):
                ids.extend(span.tokens)
                continue
            if isinstance(span, chat.ImageAssetPointerTokenSpan):
                item = next(pending)
                if span.num_tokens != item.num_tokens:
                    raise MediaError(
                        f"image layout mismatch: renderer counts {span.num_tokens} patches, expected {item.num_tokens}"
                    )
            elif isinstance(span, chat.DmelTokenSpan):
                bins = span.dmel.clone()
                item = MediaItem("audio", bins, bins.shape[0])
            else:
                raise MediaError(f"unsupported prompt span {type(span).__name__}")
            item.offset = len(ids)
            ids.extend([self.token_ids[item.kind]] * item.num_tokens)
            items.append(item)
        return ids, items

    # ---------------------------------------------------------------- native /generate

    def expand_prompt(
        self, input_ids: list[int], image_data: Any, audio_data: Any
    ) -> tuple[list[int], list[MediaItem]]:
        """Each image (audio clip) takes the place of one image (audio) placeholder token of the
        prompt, in order, and widens it to its patch (frame) count."""
        by_kind = {
            "image": [self.image(x) for x in _as_list(image_data, "image_data")],
            "audio": [self.audio(x) for x in _as_list(audio_data, "audio_data")],
        }
        for kind, found in by_kind.items():
            marks = sum(1 for t in input_ids if t == self.token_ids[kind])
            if marks != len(found):
                raise MediaError(
                    f"the prompt has {marks} {kind} placeholder token(s) (id {self.token_ids[kind]}) "
                    f"but the request carries {len(found)} {kind} input(s)"
                )
        queues = {k: iter(v) for k, v in by_kind.items()}
        kinds = {v: k for k, v in self.token_ids.items()}
        ids: list[int] = []
        items: list[MediaItem] = []
        for t in input_ids:
            kind = kinds.get(t)
            if kind is None:
                ids.append(t)
                continue
            item = next(queues[kind])
            item.offset = len(ids)
            ids.extend([t] * item.num_tokens)
            items.append(item)
        return ids, items


def _url(part: dict, key: str, where: str) -> str:
    spec = part.get(key)
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str):
        raise MediaError(f"{where}: {key} needs a 'url' string")
    return url


def _as_list(x: Any, name: str) -> list:
    if x is None:
        return []
    if isinstance(x, (str, bytes)):
        return [x]
    if isinstance(x, list):
        return x
    raise MediaError(f"'{name}' must be a string or a list of strings")


class RequestMediaProcessor(MediaProcessor):
    """The tokenizer manager's view: MediaError becomes the 400 RequestError."""

    def encode_text(self, text: str, tokenizer) -> list[int]:
        """Encode a /generate text prompt whose image/audio placeholders are spelled out (e.g.
        `<|unused_200054|>`), which plain text encoding would split into ordinary tokens."""
        marks = {tokenizer.decode([t]): t for t in self.token_ids.values()}
        ids: list[int] = []
        rest = text
        while rest:
            hits = [(rest.find(m), m) for m in marks if m in rest]
            if not hits:
                ids.extend(tokenizer.encode(rest))
                break
            at, mark = min(hits)
            ids.extend(tokenizer.encode(rest[:at]) if at else [])
            ids.append(marks[mark])
            rest = rest[at + len(mark) :]
        return ids

    def expand_request(self, input_ids: list[int], image_data: Any, audio_data: Any):
        from sgl_inkling.managers.io_struct import RequestError

        try:
            return self.expand_prompt(input_ids, image_data, audio_data)
        except MediaError as e:
            raise RequestError(str(e)) from None


def media_processor(server_args: Any, info: dict) -> RequestMediaProcessor:
    return RequestMediaProcessor(
        info.get("modalities") or (),
        getattr(server_args, "allowed_local_media_path", None),
        int(info.get("image_token_id", 200054)),
        int(info.get("audio_token_id", 200053)),
    )
