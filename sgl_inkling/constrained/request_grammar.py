"""From a request's parameters to its GrammarSpec (HTTP process; raises GrammarError for a 400).

Native API (`/generate`, `/v1/completions`) with `json_schema` / `regex` / `ebnf`:
- a raw prompt (anything not ending with `<|end_message|>`): the output is the payload alone, then a
  stop token, so the response `text` is exactly the constrained text;
- a rendered TMLv0 chat prompt (ends with `<|end_message|>`; clients that render chat themselves and
  send input_ids): the model keeps its framing, `[<|message_model|>]<|content_text|>` payload
  `<|end_message|>`, with no thinking block, so `text` (specials skipped, the default) is again
  exactly the payload.
Chat API: the framing is TMLv0's (optional thinking when reasoning is on, the constrained text
block, tool calls per tool_choice); the output parsers turn it into content and tool_calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sgl_inkling.constrained import formats as f
from sgl_inkling.constrained import validate
from sgl_inkling.constrained.spec import GrammarError, GrammarSpec
from sgl_inkling.constrained.tmlv0 import (
    PAYLOAD_JSON_SEPARATORS,
    Framing,
    ToolDecl,
    structured_turn,
    tool_turn,
)


def payload_format(
    json_schema: Any = None, regex: Any = None, ebnf: Any = None, structural_tag: Any = None
) -> tuple[f.Format, str] | None:
    """The validated payload constraint and its kind, or None when the request has none."""
    kinds = (("json_schema", json_schema), ("regex", regex), ("ebnf", ebnf), ("structural_tag", structural_tag))
    given = [k for k, v in kinds if v is not None]
    if len(given) > 1:
        raise GrammarError(f"only one of json_schema, regex, ebnf, structural_tag may be set (got {', '.join(given)})")
    if json_schema is not None:
        return f.json_schema(validate.json_schema(json_schema), PAYLOAD_JSON_SEPARATORS), "json_schema"
    if regex is not None:
        return f.regex(validate.regex(regex)), "regex"
    if ebnf is not None:
        return f.ebnf(validate.ebnf(ebnf)), "ebnf"
    if structural_tag is not None:
        return validate.structural_tag(structural_tag), "structural_tag"
    return None


def native_grammar(tokenizer: Any, sampling_params: Any, input_ids: Sequence[int]) -> GrammarSpec | None:
    """The grammar of a native request (see the module docs for the framing rule)."""
    sp = sampling_params
    payload = payload_format(sp.json_schema, sp.regex, sp.ebnf, getattr(sp, "structural_tag", None))
    if payload is None:
        return None
    fmt, kind = payload
    fr = Framing.of(tokenizer)
    if input_ids and input_ids[-1] == fr.end_message:
        fmt = structured_turn(fr, fmt, thinking=False)
    return GrammarSpec(f.structural_tag(fmt), kind)


def _tool_decls(tools: Sequence[Mapping[str, Any]]) -> list[ToolDecl]:
    decls = []
    for tool in tools:
        fn = tool.get("function") or {}
        name = fn.get("name")
        decls.append(ToolDecl(name, validate.tool_parameters(name, fn.get("parameters"))))
    return decls


def _choice_name(tool_choice: Any) -> str:
    """The choice as "auto", "required", "none" or a function name (OpenAI object form included)."""
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str):
        return tool_choice
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name")
    else:  # the protocol's pydantic object
        name = getattr(getattr(tool_choice, "function", None), "name", None)
    if isinstance(name, str):
        return name
    raise GrammarError(f"tool_choice must be 'none', 'auto', 'required' or a function, got {tool_choice!r}")


def chat_grammar(
    tokenizer: Any,
    *,
    json_schema: Any = None,
    regex: Any = None,
    ebnf: Any = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool = True,
    thinking: bool = True,
) -> GrammarSpec | None:
    """The grammar of a chat request; None when nothing is constrained (no format, no tools).

    tools: OpenAI tool dicts as rendered into the prompt (None when hidden by tool_choice "none").
    thinking: whether a thinking block is allowed (reasoning effort above zero).
    """
    payload = payload_format(json_schema, regex, ebnf)
    choice = _choice_name(tool_choice)
    fr = Framing.of(tokenizer)
    if tools and choice != "none":
        decls = _tool_decls(tools)
        if choice not in ("auto", "required") and choice not in {d.name for d in decls}:
            raise GrammarError(f"tool_choice names {choice!r}, which is not in tools")
        fmt = tool_turn(
            fr,
            decls,
            choice,
            parallel=parallel_tool_calls,
            thinking=thinking,
            text_payload=payload[0] if payload else None,
        )
        return GrammarSpec(f.structural_tag(fmt), "tools" if choice == "auto" else f"tool_choice={choice}")
    if choice == "required":
        raise GrammarError("tool_choice 'required' needs tools")
    if payload is None:
        return None
    return GrammarSpec(f.structural_tag(structured_turn(fr, payload[0], thinking)), payload[1])
