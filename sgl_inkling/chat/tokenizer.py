"""Inkling's tokenizer: tml-renderers' o200k chat tokenizer behind a small, never-raising API.

Checkpoints carry no tokenizer files; the vocabulary ships inside the tml-renderers package, so no
network or checkpoint access is needed. Special-token ids are always asked from the tokenizer.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tml_renderers import tokenizers

# U+FFFD as UTF-8: what an id the vocabulary does not know decodes to.
_REPLACEMENT_BYTES = "\ufffd".encode()


def _bare_name(name: str) -> str:
    """'<|end_message|>' -> 'end_message' (tml-renderers names specials without the brackets)."""
    if name.startswith("<|") and name.endswith("|>"):
        return name[2:-2]
    return name


@dataclass(frozen=True)
class FramingTokens:
    """The TMLv0 structural token ids, resolved from the tokenizer once."""

    end_message: int
    end_of_turn: frozenset[int]  # <|content_model_end_sampling|>, <|endoftext|>
    message_starts: frozenset[int]  # <|message_model|>, <|message_user|>, ...
    content_kinds: dict[int, str]  # id of <|content_KIND|> -> "KIND"
    message_model: int
    content_text: int
    content_thinking: int
    content_invoke_tool_json: int


class InklingTokenizer:
    """Encode/decode with Inkling's vocabulary; decoding never raises on odd ids or partial UTF-8."""

    def __init__(self, tml_tokenizer: tokenizers.O200kBaseChatTokenizer | None = None) -> None:
        self._tok = tml_tokenizer if tml_tokenizer is not None else tokenizers.O200kBaseChatTokenizer()
        self._special_ids: dict[str, int] = {
            n: self._tok.encode_special(n) for n in self._tok.special_tokens()
        }
        self._special_id_set = frozenset(self._special_ids.values())
        # Per-id byte cache: decoding one id at a time through the extension is the streaming hot path.
        self._bytes_cache: dict[int, bytes] = {}

    @property
    def tml(self) -> tokenizers.O200kBaseChatTokenizer:
        """The wrapped tml-renderers tokenizer (what `v0.Renderer` needs)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        # Specials sit at the top of the id space, so the largest special id bounds the vocabulary.
        return max(self._special_id_set) + 1

    @property
    def eos_token_ids(self) -> list[int]:
        return [self.token_id("content_model_end_sampling"), self.token_id("endoftext")]

    @functools.cached_property
    def framing(self) -> FramingTokens:
        ids = self._special_ids
        kinds = {
            i: n.removeprefix("content_")
            for n, i in ids.items()
            if n.startswith("content_") and n != "content_model_end_sampling"
        }
        return FramingTokens(
            end_message=ids["end_message"],
            end_of_turn=frozenset((ids["content_model_end_sampling"], ids["endoftext"])),
            message_starts=frozenset(i for n, i in ids.items() if n.startswith("message_")),
            content_kinds=kinds,
            message_model=ids["message_model"],
            content_text=ids["content_text"],
            content_thinking=ids["content_thinking"],
            content_invoke_tool_json=ids["content_invoke_tool_json"],
        )

    def encode(self, text: str) -> list[int]:
        """Ordinary text: a spelled-out '<|end_message|>' stays text, never a special token."""
        return list(self._tok.encode_ordinary(text))

    def token_id(self, name: str) -> int:
        """Id of a special token, by '<|name|>' or 'name'."""
        try:
            return self._special_ids[_bare_name(name)]
        except KeyError:
            raise ValueError(f"unknown special token {name!r}") from None

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_id_set

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one id (a special's spelling; U+FFFD for an id outside the vocabulary)."""
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            try:
                cached = bytes(self._tok.decode_bytes([token_id]))
            except (ValueError, OverflowError, TypeError):
                cached = _REPLACEMENT_BYTES
            self._bytes_cache[token_id] = cached
        return cached

    def ids_to_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        return b"".join(
            self.token_bytes(i) for i in ids if not (skip_special_tokens and i in self._special_id_set)
        )

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Lossy decode: invalid or incomplete UTF-8 becomes U+FFFD, unknown ids too; never raises."""
        return self.ids_to_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")


class IncrementalDetokenizer:
    """Turns token ids, fed a batch at a time, into newly completed text.

    Bytes of a UTF-8 character split across tokens are held back until the character completes
    (as SGLang/vLLM detokenizers do); `finish()` flushes what is left as U+FFFD. Concatenating every
    `feed()` and the `finish()` equals `tokenizer.decode(all_ids)`, because both use the same
    UTF-8 decoder with errors='replace'.
    """

    def __init__(self, tokenizer: InklingTokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        return self._decoder.decode(self._tokenizer.ids_to_bytes(ids, self._skip_special))

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)


@functools.cache
def _shared_tokenizer() -> InklingTokenizer:
    return InklingTokenizer()


def get_tokenizer(path: str | None = None) -> InklingTokenizer:
    """The Inkling tokenizer, built once per process (construction takes ~2 s).

    `path` (a checkpoint or --tokenizer-path) is accepted for interface compatibility: every Inkling
    checkpoint uses tml-renderers' o200k chat vocabulary, which the renderer requires anyway.
    """
    del path
    return _shared_tokenizer()
