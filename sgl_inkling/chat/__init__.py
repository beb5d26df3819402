"""Chat layer: tml-renderers glue for prompts, plus reasoning and tool-call parsing of outputs."""

from sgl_inkling.chat.output_parser import ParsedOutput, ToolCall, parse_output
from sgl_inkling.chat.render import ChatRequestError, RenderedPrompt, render_chat
from sgl_inkling.chat.stream_parser import Delta, StreamingOutputParser, ToolCallDelta
from sgl_inkling.chat.tokenizer import IncrementalDetokenizer, InklingTokenizer, get_tokenizer

# --reasoning-parser / --tool-call-parser names. Inkling has one format, so each name selects the
# same parser; the HTTP layer checks membership to reject unknown names, then sets
# StreamingOutputParser(separate_reasoning=..., parse_tool_calls=...) from which flags were given.
REASONING_PARSERS: dict[str, type[StreamingOutputParser]] = {"inkling": StreamingOutputParser}
TOOL_CALL_PARSERS: dict[str, type[StreamingOutputParser]] = {"inkling": StreamingOutputParser}

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "ChatRequestError",
    "Delta",
    "IncrementalDetokenizer",
    "InklingTokenizer",
    "ParsedOutput",
    "RenderedPrompt",
    "StreamingOutputParser",
    "ToolCall",
    "ToolCallDelta",
    "get_tokenizer",
    "parse_output",
    "render_chat",
]
