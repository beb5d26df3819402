"""Generated token ids of a model turn -> content, reasoning and OpenAI tool calls.

A model turn is a run of TMLv0 blocks (`<|message_model|>` [header] `<|content_KIND|>` payload
`<|end_message|>`) closed by `<|content_model_end_sampling|>`; the first block is often header-less.
The block framing is followed by `StreamingOutputParser` (one state machine for both the streaming
and the non-streaming paths, so the two always agree); each finished tool-call block is validated
and decoded by tml-renderers' own parser, with a lenient JSON fallback for blocks tml rejects only
for a cosmetic reason (such as a header name padded with spaces).
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tml_renderers import chat, v0

from sgl_inkling.chat.tokenizer import InklingTokenizer, get_tokenizer


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of the call's "args" object

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class ParsedOutput:
    content: str = ""
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@functools.cache
def default_tml_parser(tokenizer: InklingTokenizer) -> v0.Parser:
    """A tml parser for model output when the caller has none from its rendered prompt."""
    return v0.Renderer(tokenizer.tml).render_for_completion([])[1]


def _args_from_tml(inv: chat.InvokeTool) -> dict[str, Any]:
    # tml hands back each argument's value as JSON text; a repeated key keeps its last value, as json.loads.
    return {arg.name: json.loads(arg.value) for arg in inv.args}


def interpret_tool_call(
    tokenizer: InklingTokenizer,
    header_ids: Sequence[int],
    payload_ids: Sequence[int],
    tml_parser: v0.Parser | None = None,
) -> tuple[str, dict[str, Any]] | None:
    """(name, args) of one complete `<|content_invoke_tool_json|>` block, or None if it is not a call."""
    fr = tokenizer.framing
    block = [fr.message_model, *header_ids, fr.content_invoke_tool_json, *payload_ids, fr.end_message]
    try:
        messages = (tml_parser or default_tml_parser(tokenizer)).parse_tokens(block)
        calls = [m.content for m in messages if isinstance(m.content, chat.InvokeTool)]
        if len(calls) == 1 and calls[0].text is None and calls[0].name:
            return calls[0].name, _args_from_tml(calls[0])
    except Exception:  # tml raises ParseError (a ValueError) on malformed blocks; fall back below
        pass
    # Lenient path: valid JSON of the right shape is a call even if tml disliked the header.
    try:
        obj = json.loads(tokenizer.decode(payload_ids))
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("args"), dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        name = tokenizer.decode(header_ids).strip()
    return (name.strip(), obj["args"]) if name.strip() else None


def parse_output(
    token_ids: Sequence[int],
    tokenizer: InklingTokenizer | None = None,
    *,
    separate_reasoning: bool = True,
    parse_tool_calls: bool = True,
    tml_parser: v0.Parser | None = None,
    tool_headers: bool = True,
) -> ParsedOutput:
    """Parse a whole generated turn. Never raises on malformed, truncated or garbage output."""
    # Imported here: the streaming parser builds on this module's types.
    from sgl_inkling.chat.stream_parser import StreamingOutputParser

    parser = StreamingOutputParser(
        tokenizer or get_tokenizer(),
        separate_reasoning=separate_reasoning,
        parse_tool_calls=parse_tool_calls,
        tml_parser=tml_parser,
        tool_headers=tool_headers,
    )
    parser.feed(token_ids)
    parser.finish()
    return parser.result()
