"""Tokenizer wrapper and incremental detokenizer: specials by name, lossless text, never-raising decode."""

from __future__ import annotations

import pytest

from sgl_inkling.chat.tokenizer import IncrementalDetokenizer, get_tokenizer


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


def test_get_tokenizer_is_shared(tok):
    assert get_tokenizer() is tok
    assert get_tokenizer("/some/checkpoint") is tok


def test_special_tokens_by_name_and_spelling(tok):
    end = tok.token_id("<|end_message|>")
    assert tok.token_id("end_message") == end
    assert tok.decode([end]) == "<|end_message|>"
    assert tok.is_special(end)
    with pytest.raises(ValueError):
        tok.token_id("<|no_such_token|>")


def test_encode_keeps_special_spellings_as_text(tok):
    text = "say <|end_message|> and <|content_model_end_sampling|> literally"
    ids = tok.encode(text)
    assert not any(tok.is_special(i) for i in ids)
    assert tok.token_id("end_message") not in ids
    assert tok.decode(ids) == text


def test_eos_ids_are_end_of_turn_and_endoftext(tok):
    eos = tok.eos_token_ids
    assert {tok.decode([i]) for i in eos} == {"<|content_model_end_sampling|>", "<|endoftext|>"}


def test_vocab_size_covers_every_special(tok):
    names = ["endoftext", "message_model", "content_invoke_tool_json", "content_invoke_tool_text"]
    assert all(tok.token_id(n) < tok.vocab_size for n in names)
    assert tok.vocab_size > 200_000


def test_decode_never_raises(tok):
    emoji = tok.encode("🎉")
    assert len(emoji) > 1, "test needs a character split over tokens"
    # A dangling UTF-8 prefix, an id past the vocabulary and a negative id all decode to U+FFFD.
    for ids in ([emoji[0]], [tok.vocab_size + 5], [-1], [*tok.encode("ok"), 10**12]):
        out = tok.decode(ids)
        assert "\ufffd" in out
    assert tok.decode(tok.encode("héllo 日本")) == "héllo 日本"


def test_decode_skip_special_tokens(tok):
    ids = [
        tok.token_id("message_model"),
        tok.token_id("content_text"),
        *tok.encode("Hi"),
        tok.token_id("end_message"),
    ]
    assert tok.decode(ids, skip_special_tokens=True) == "Hi"
    assert tok.decode(ids) == "<|message_model|><|content_text|>Hi<|end_message|>"


def test_incremental_detokenizer_holds_back_partial_characters(tok):
    text = "a🎉b日本"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.feed([i]) for i in ids]
    pieces.append(detok.finish())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # The emoji's first byte-token alone must produce nothing yet.
    emoji = tok.encode("🎉")
    detok = IncrementalDetokenizer(tok)
    assert detok.feed(emoji[:1]) == ""
    assert detok.feed(emoji[1:]) == "🎉"


def test_incremental_detokenizer_flushes_dangling_bytes_and_skips_specials(tok):
    emoji = tok.encode("🎉")
    detok = IncrementalDetokenizer(tok)
    assert detok.feed(emoji[:1]) == ""
    assert detok.finish() == "\ufffd"
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
    out = detok.feed([tok.token_id("content_text"), *tok.encode("x y"), tok.token_id("end_message")])
    assert out + detok.finish() == "x y"
