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


def structural_tag(source: Any) -> dict:
    """An xgrammar structural tag (JSON text) as its format: the current form (`format`) or SGLang's
    older one (`structures` with begin/schema/end, and `triggers`), which is lowered to the former."""
    try:
        tag = json.loads(source) if isinstance(source, str) else None
    except ValueError as e:
        raise GrammarError(f"structural_tag is not valid JSON: {e}") from None
    if not isinstance(tag, dict):
        raise GrammarError("structural_tag must be a JSON object")
    if "format" in tag:
        fmt = tag["format"]
    elif "structures" in tag:
        structures, triggers = tag.get("structures"), tag.get("triggers")
        if not isinstance(structures, list) or not isinstance(triggers, list) or not all(
            isinstance(s, dict) and {"begin", "schema", "end"} <= set(s) for s in structures
        ):
            raise GrammarError("structural_tag: 'structures' must be a list of {begin, schema, end} with 'triggers'")
        tags = [
            {"begin": s["begin"], "content": {"type": "json_schema", "json_schema": json_schema(s["schema"])},
             "end": s["end"]}
            for s in structures
        ]  # fmt: skip
        fmt = {"type": "triggered_tags", "triggers": triggers, "tags": tags}
    else:
        raise GrammarError("structural_tag needs a 'format' (or SGLang's older 'structures' and 'triggers')")
    try:
        xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": fmt}))
    except Exception as e:
        raise GrammarError(f"invalid structural_tag: {_clean(e)}") from None
    return fmt


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
