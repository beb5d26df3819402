"""Check client grammars in the HTTP process, so a bad one is a 400 with a message, never a failure
inside the scheduler. Each check also asks xgrammar to parse the source (cheap, no vocabulary), so
what passes here is what the scheduler can compile."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import xgrammar as xgr
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from sgl_inkling.constrained.schema_keywords import check_enforceable
from sgl_inkling.constrained.spec import GrammarError

# xgrammar prefixes its messages with "[hh:mm:ss] /path/file.cc:123: "; clients need only the rest.
_XGR_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")


def _clean(e: BaseException) -> str:
    text = _XGR_PREFIX.sub("", str(e)).strip()
    return text.splitlines()[0] if text else type(e).__name__


def json_schema(value: Any, what: str = "json_schema") -> dict | bool:
    """A JSON schema (JSON text or already parsed) checked against its metaschema and by xgrammar."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)  # no recursion: nesting beyond 1024 is an error, not a crash
        except orjson.JSONDecodeError as e:
            raise GrammarError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(value, (dict, bool)):
        raise GrammarError(f"{what} must be a JSON schema object, got {type(value).__name__}")
    if isinstance(value, dict):
        try:
            validator_for(value).check_schema(value)
        except RecursionError:
            raise GrammarError(f"{what} is nested too deeply") from None
        except SchemaError as e:
            where = "/".join(str(p) for p in e.absolute_path)
            raise GrammarError(
                f"{what} is not a valid JSON schema{f' at {where}' if where else ''}: {e.message}"
            ) from None
        check_enforceable(value, what)
    try:
        xgr.Grammar.from_json_schema(json.dumps(value))
    except Exception as e:  # xgrammar raises RuntimeError/ValueError for schemas it cannot convert
        raise GrammarError(f"{what} is not supported for constrained decoding: {_clean(e)}") from None
    return value


def regex(pattern: Any) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise GrammarError("regex must be a non-empty string")
    try:
        xgr.Grammar.from_regex(pattern)
    except Exception as e:
        raise GrammarError(f"invalid regex: {_clean(e)}") from None
    return pattern


def ebnf(source: Any) -> str:
    if not isinstance(source, str) or not source.strip():
        raise GrammarError("ebnf must be a non-empty string")
    try:
        xgr.Grammar.from_ebnf(source)
    except Exception as e:
        raise GrammarError(f"invalid EBNF grammar (the start rule is `root`): {_clean(e)}") from None
    return source


def tool_parameters(name: str, parameters: Any) -> dict[str, Any]:
    """A tool's arguments schema; TMLv0 carries arguments as a JSON object, so it must describe one."""
    what = f"tool {name!r} parameters"
    if not isinstance(parameters, dict):
        raise GrammarError(f"{what}: a JSON schema object is required")
    kind = parameters.get("type", "object")
    if kind != "object":
        raise GrammarError(f"{what}: the schema must have type 'object', got {kind!r}")
    schema = {"type": "object", **parameters}
    json_schema(schema, what)
    return schema
