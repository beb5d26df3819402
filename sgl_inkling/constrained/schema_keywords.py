"""JSON-schema keywords that xgrammar accepts but does not enforce: refused, so that a schema is
either honoured by constrained decoding or answered with a 400 naming the keyword.

Found by probing xgrammar 0.2.9: for each keyword, an instance the jsonschema validator rejects is
checked against the compiled grammar (test/unit/test_schema_keywords.py keeps the probe, so a newer
xgrammar that starts enforcing one shows up as a failing test to shrink this list).
"""

from __future__ import annotations

from typing import Any

from sgl_inkling.constrained.spec import GrammarError

# Always ignored by xgrammar's schema converter.
UNENFORCED = ("not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
              "contains", "minContains", "maxContains")  # fmt: skip
# Keywords that may sit beside anyOf/oneOf without changing what is valid.
ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
               "writeOnly", "$id", "$schema", "$anchor", "$defs", "definitions", "nullable"}  # fmt: skip
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalItems", "additionalProperties", "unevaluatedProperties",
                  "unevaluatedItems", "propertyNames", "contains", "not", "if", "then", "else")  # fmt: skip


def _problem(node: dict) -> str | None:
    for kw in UNENFORCED:
        if kw in node:
            return f"'{kw}'"
    if node.get("uniqueItems") is True:
        return "'uniqueItems'"
    if "multipleOf" in node and not (node.get("type") == "integer" and isinstance(node["multipleOf"], int)):
        return "'multipleOf' (xgrammar enforces it on integer types with an integer divisor only)"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        return "'allOf' with more than one subschema (merge them into one)"
    for combo in ("anyOf", "oneOf"):
        if combo in node:
            siblings = sorted(set(node) - ANNOTATIONS - {combo})
            if siblings:
                return f"'{siblings[0]}' beside '{combo}' (move it into each branch)"
    return None


def check_enforceable(schema: Any, what: str) -> None:
    """Raise GrammarError naming the first keyword (and where) that xgrammar would not enforce."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:  # iterative: a deeply nested schema must not exhaust the interpreter's stack
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        problem = _problem(node)
        if problem is not None:
            where = f" at {path}" if path else ""
            raise GrammarError(
                f"{what}: the JSON-schema keyword {problem}{where} cannot be enforced by constrained decoding"
            )
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack += [(v, f"{path}/{key}/{k}") for k, v in node[key].items()]
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack += [(v, f"{path}/{key}/{i}") for i, v in enumerate(node[key])]
        for key in _SCHEMA_VALUES:
            if key in node:
                stack.append((node[key], f"{path}/{key}"))
