"""Grammars of a whole TMLv0 model turn: thinking, visible text and tool-call blocks.

A model turn is a run of blocks `<|message_model|>` [header] `<|content_KIND|>` payload
`<|end_message|>`, and the first block may come without `<|message_model|>` (the prompt ends after
the last `<|end_message|>`). The grammars below end after the last block's `<|end_message|>`; there
the matcher allows exactly the stop tokens (`<|content_model_end_sampling|>`, `<|endoftext|>`), so
the end of the turn is always legal once the constrained part is complete.

Only what the request demands is constrained: thinking and free text are any run of ordinary
tokens; framing is matched as whole special tokens (see vocab.py); a tool call's header must be a
declared tool's name and its JSON must be `{"name": NAME, "args": <that tool's schema>}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sgl_inkling.constrained import formats as f
from sgl_inkling.constrained.vocab import special_token_ids

# JSON layout, fixed (free whitespace lets a weak model pad forever): tool calls exactly as training
# renders them (`{"name":"x","args":{...}}`), structured-output payloads as json.dumps writes them.
TOOL_JSON_SEPARATORS = (",", ":")
PAYLOAD_JSON_SEPARATORS = (", ", ": ")


@dataclass(frozen=True)
class Framing:
    """The special token ids the grammars are built from (asked from the tokenizer, never hard-coded)."""

    message_model: int
    content_text: int
    content_thinking: int
    content_invoke_tool_json: int
    end_message: int
    specials: tuple[int, ...]  # every special id: none of them may appear inside a payload

    @classmethod
    def of(cls, tokenizer: Any) -> Framing:
        fr = tokenizer.framing
        return cls(
            message_model=fr.message_model,
            content_text=fr.content_text,
            content_thinking=fr.content_thinking,
            content_invoke_tool_json=fr.content_invoke_tool_json,
            end_message=fr.end_message,
            specials=special_token_ids(tokenizer),
        )


@dataclass(frozen=True)
class ToolDecl:
    name: str
    parameters: dict[str, Any]  # a validated object schema


# -- blocks (without the leading <|message_model|>) ------------------------------------------------


def free_text(fr: Framing) -> f.Format:
    return f.any_tokens(fr.specials)


def _block(fr: Framing, kind: int, payload: f.Format) -> f.Format:
    return f.seq(f.token(kind), payload, f.token(fr.end_message))


def thinking_block(fr: Framing) -> f.Format:
    return _block(fr, fr.content_thinking, free_text(fr))


def text_block(fr: Framing, payload: f.Format | None = None) -> f.Format:
    return _block(fr, fr.content_text, payload if payload is not None else free_text(fr))


def call_schema(tool: ToolDecl) -> dict[str, Any]:
    """The tool-call payload: the name first (as rendered in training), then the arguments."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "args": tool.parameters},
        "required": ["name", "args"],
        "additionalProperties": False,
    }


def tool_call_block(fr: Framing, tool: ToolDecl) -> f.Format:
    # The header names the tool too: the parsers read it, and the model was trained to write it.
    return f.seq(
        f.const(tool.name),
        f.token(fr.content_invoke_tool_json),
        f.json_schema(call_schema(tool), TOOL_JSON_SEPARATORS),
        f.token(fr.end_message),
    )


# -- turns -----------------------------------------------------------------------------------------


def _turn(fr: Framing, first: f.Format) -> f.Format:
    """A turn whose first block may be header-less: [<|message_model|>] first."""
    return f.seq(f.optional(f.token(fr.message_model)), first)


def _then(fr: Framing, block: f.Format) -> f.Format:
    return f.seq(f.token(fr.message_model), block)


def structured_turn(fr: Framing, payload: f.Format, thinking: bool) -> f.Format:
    """[thinking block] then one text block whose payload is constrained."""
    body = text_block(fr, payload)
    if thinking:
        body = f.one_of(body, f.seq(thinking_block(fr), _then(fr, body)))
    return _turn(fr, body)


def tool_turn(
    fr: Framing,
    tools: Sequence[ToolDecl],
    choice: str,
    *,
    parallel: bool,
    thinking: bool,
    text_payload: f.Format | None = None,
) -> f.Format:
    """choice: "auto", "required", or the name of the one tool to call."""
    if choice == "auto":
        return _auto_turn(fr, tools, parallel, thinking, text_payload)
    chosen = list(tools) if choice == "required" else [t for t in tools if t.name == choice]
    if not chosen:
        raise ValueError(f"no declared tool named {choice!r}")
    call = f.one_of(*(tool_call_block(fr, t) for t in chosen))
    calls = f.seq(call, f.star(_then(fr, call))) if parallel and choice == "required" else call
    if thinking:
        # Either the call opens the turn, or a thinking block does and the call follows.
        return _turn(fr, f.one_of(calls, f.seq(thinking_block(fr), _then(fr, calls))))
    return _turn(fr, calls)


def _auto_turn(
    fr: Framing, tools: Sequence[ToolDecl], parallel: bool, thinking: bool, text_payload: f.Format | None
) -> f.Format:
    plain = [text_block(fr, text_payload)] + ([thinking_block(fr)] if thinking else [])
    calls = [tool_call_block(fr, t) for t in tools]
    if parallel:
        block = f.one_of(*plain, *calls)
        return _turn(fr, f.seq(block, f.star(_then(fr, block))))
    # Without parallel calls, at most one call and nothing after it.
    plain_block, call = f.one_of(*plain), f.one_of(*calls)
    plain_run = f.seq(plain_block, f.star(_then(fr, plain_block)), f.optional(_then(fr, call)))
    return _turn(fr, f.one_of(call, plain_run))
