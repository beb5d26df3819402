"""Constructors for xgrammar structural-tag formats (plain dicts), so grammars read like EBNF."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import xgrammar as xgr

Format = dict[str, Any]

# xgrammar (0.2.x) writes the characters of a length-bounded JSON string (minLength/maxLength) as
# "anything but quote, backslash, CR, LF", which lets raw control characters such as TAB through:
# invalid JSON. They are swapped for the class its unbounded strings use (no control characters).
_BOUNDED_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\]"


def token(token_id: int) -> Format:
    """Exactly this token id (never its spelling re-tokenized)."""
    return {"type": "token", "token": int(token_id)}


def any_tokens(exclude: Iterable[int]) -> Format:
    """Zero or more tokens, none of them in `exclude` (free text, matched per token: cheap masks)."""
    return {"type": "any_tokens", "exclude_tokens": sorted(int(t) for t in exclude)}


def const(text: str) -> Format:
    return {"type": "const_string", "value": text}


def json_schema(schema: dict | bool, separators: tuple[str, str]) -> Format:
    """JSON matching the schema, written with exactly these separators and no other whitespace.

    xgrammar's structural-tag JSON format allows free whitespace between tokens, which a model can
    spend forever on; its schema converter can fix the layout instead, so the converted grammar is
    embedded as EBNF (its own rule names stay scoped to this element).
    """
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=separators)
    return ebnf(str(grammar).replace(_BOUNDED_STRING_CHAR, _JSON_STRING_CHAR))


def regex(pattern: str) -> Format:
    return {"type": "regex", "pattern": pattern}


def ebnf(source: str) -> Format:
    return {"type": "grammar", "grammar": source}


def seq(*elements: Format) -> Format:
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": list(elements)}


def one_of(*elements: Format) -> Format:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": list(elements)}


def optional(content: Format) -> Format:
    return {"type": "optional", "content": content}


def star(content: Format) -> Format:
    return {"type": "star", "content": content}


def structural_tag(fmt: Format) -> str:
    """The JSON text xgrammar compiles (and the cache key). Keys keep their order: a JSON schema's
    property order is the order the grammar generates them in."""
    return json.dumps({"type": "structural_tag", "format": fmt}, separators=(",", ":"))
