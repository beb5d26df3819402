"""xgrammar's view of Inkling's vocabulary: token bytes, with the TML special tokens made unmatchable
as text so that grammars can use them only as whole-token terminals.

Why the specials are spelled oddly: xgrammar matches a token two ways, as a whole token (the
structural-tag `token` formats) and by its bytes against the grammar's characters. A special token
spelled `<|end_message|>` would then also be accepted inside a JSON string or a free-text regex,
where our output parsers (which read token ids) would take it as framing and cut the payload. An
empty spelling is no better: xgrammar then marks the id as special and refuses it even as a token
terminal. So each special is spelled with a leading 0xFF byte, which no valid UTF-8 text contains:
the byte path never matches it, the token path still does, and the stop tokens keep working.
"""

from __future__ import annotations

import functools

import xgrammar as xgr

# Prefixed to every special token's spelling; 0xFF never occurs in UTF-8, so no text rule matches it.
UNMATCHABLE_PREFIX = b"\xff"


def special_token_ids(tokenizer) -> tuple[int, ...]:
    """Every special id of the vocabulary, ascending (framing, stop and unused placeholders)."""
    return _special_ids(tokenizer)


@functools.cache
def _special_ids(tokenizer) -> tuple[int, ...]:
    return tuple(i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i))


def encoded_vocab(tokenizer, vocab_size: int) -> list[bytes]:
    """Token bytes for ids [0, vocab_size); ids past the tokenizer (padding) get unmatchable bytes."""
    out = []
    for i in range(vocab_size):
        if i >= tokenizer.vocab_size:
            out.append(UNMATCHABLE_PREFIX + f"<pad_{i}>".encode())
        elif tokenizer.is_special(i):
            out.append(UNMATCHABLE_PREFIX + tokenizer.token_bytes(i))
        else:
            out.append(tokenizer.token_bytes(i))
    return out


def build_tokenizer_info(tokenizer, vocab_size: int | None = None) -> xgr.TokenizerInfo:
    """TokenizerInfo whose mask width is the model's logits width (the unpadded vocabulary)."""
    size = vocab_size or tokenizer.vocab_size
    return xgr.TokenizerInfo(
        encoded_vocab(tokenizer, size),
        xgr.VocabType.RAW,  # o200k tokens are raw bytes (tiktoken), no byte-level remapping
        vocab_size=size,
        stop_token_ids=list(tokenizer.eos_token_ids),
    )
