"""Token ids, fed as they are sampled -> OpenAI-style deltas (content, reasoning, tool calls).

The state machine follows the TMLv0 framing token by token:
- HEADER: between blocks (and at the start: the first block may be header-less). Tokens collect as
  a header until a `<|content_KIND|>` opens a block; a tool name is such a header, so header text is
  held back and never reaches `content`. A header ended without a content kind was a stray message
  and is shown as content; one cut off by the end of output may be a partial tool name: dropped.
  With no tools declared (tool_headers=False) nothing can be a tool name: a header-less block is
  text from its first token.
- BLOCK: payload until `<|end_message|>` (or end of turn). Text and thinking stream as decoded;
  a tool-call payload streams its "args" object through `ArgsScanner`; the finished block is
  validated by tml-renderers' parser (see `interpret_tool_call`).
- DONE: after `<|content_model_end_sampling|>` / `<|endoftext|>` everything is ignored.

A tool call's first delta (index, id, name) goes out when its "args" object starts and its name is
known. A call that later proves invalid (truncated, bad JSON) is left out of `result()`; its
already-streamed deltas cannot be taken back, which is the one place the stream and the final parse
may differ (the finish reason then says why: length, or a malformed call).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from tml_renderers import v0

from sgl_inkling.chat.args_scanner import ArgsScanner
from sgl_inkling.chat.output_parser import ParsedOutput, ToolCall, interpret_tool_call, new_tool_call_id
from sgl_inkling.chat.tokenizer import IncrementalDetokenizer, InklingTokenizer, get_tokenizer

# Longer than any tool name: a header past this is text written without framing, shown as content.
MAX_HEADER_TOKENS = 64
_HEADER, _BLOCK, _DONE = "header", "block", "done"


@dataclass
class ToolCallDelta:
    index: int
    id: str | None = None  # set on a call's first delta only, with name
    name: str | None = None
    arguments: str = ""


@dataclass
class Delta:
    """One OpenAI `choices[].delta`: exactly one of the three fields is set."""

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class _PendingCall:
    header_ids: list[int]
    header_name: str
    scanner: ArgsScanner = field(default_factory=ArgsScanner)
    unsent_args: str = ""
    index: int | None = None  # set when the first delta is sent
    id: str = ""
    name: str = ""


class StreamingOutputParser:
    def __init__(
        self,
        tokenizer: InklingTokenizer | None = None,
        *,
        separate_reasoning: bool = True,
        parse_tool_calls: bool = True,
        tml_parser: v0.Parser | None = None,
        tool_headers: bool = True,
    ) -> None:
        self._tok = tokenizer or get_tokenizer()
        self._tool_headers = tool_headers
        self._fr = self._tok.framing
        self._separate_reasoning = separate_reasoning
        self._parse_tool_calls = parse_tool_calls
        self._tml_parser = tml_parser
        self._mode = _HEADER
        self._header: list[int] = []
        self._kind = ""
        self._payload: list[int] = []
        self._run: list[int] = []  # payload tokens not yet decoded (decoded in batches)
        self._detok: IncrementalDetokenizer | None = None
        self._call: _PendingCall | None = None
        self._calls_sent = 0
        self._out: list[Delta] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._tool_calls: list[ToolCall] = []

    @property
    def finished(self) -> bool:
        return self._mode == _DONE

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The complete, valid tool calls so far."""
        return list(self._tool_calls)

    def feed(self, ids: Iterable[int]) -> list[Delta]:
        fr = self._fr
        for t in ids:
            t = int(t)
            if self._mode == _DONE:
                break
            if self._mode == _BLOCK:
                if t == fr.end_message or t in fr.end_of_turn:
                    self._close_block(complete=True)
                    self._mode = _DONE if t in fr.end_of_turn else _HEADER
                else:
                    self._run.append(t)
                continue
            # _HEADER
            if t in fr.end_of_turn or t == fr.end_message or t in fr.message_starts:
                self._flush_orphan_header()
                if t in fr.end_of_turn:
                    self._mode = _DONE
            elif t in fr.content_kinds:
                self._open_block(fr.content_kinds[t], self._header)
                self._header = []
            elif not self._tool_headers:
                self._open_block("text", [])
                self._run.append(t)
            else:
                self._header.append(t)
                if len(self._header) > MAX_HEADER_TOKENS:
                    self._open_block("text", [])
                    self._run, self._header = self._header, []
        self._decode_run()
        return self._take()

    def finish(self) -> list[Delta]:
        """End of output: flush held-back text; drop a cut-off tool call or header."""
        if self._mode == _BLOCK:
            self._decode_run()
            self._close_block(complete=False)
        self._header = []
        self._mode = _DONE
        return self._take()

    def result(self) -> ParsedOutput:
        reasoning = "".join(self._reasoning)
        return ParsedOutput(
            content="".join(self._content),
            reasoning_content=reasoning or None,
            tool_calls=list(self._tool_calls),
        )

    # -- blocks ------------------------------------------------------------------------------------

    def _channel(self, kind: str) -> str:
        if kind == "thinking" and self._separate_reasoning:
            return "reasoning"
        if kind == "invoke_tool_json" and self._parse_tool_calls:
            return "tool"
        return "content"  # text, and any other kind: shown rather than lost

    def _open_block(self, kind: str, header: list[int]) -> None:
        self._mode, self._kind = _BLOCK, kind
        self._payload, self._run = [], []
        self._detok = IncrementalDetokenizer(self._tok)
        if self._channel(kind) == "tool":
            self._call = _PendingCall(header_ids=list(header), header_name=self._tok.decode(header).strip())

    def _decode_run(self) -> None:
        if self._mode != _BLOCK or not self._run or self._detok is None:
            return
        self._payload.extend(self._run)
        text = self._detok.feed(self._run)
        self._run = []
        self._on_text(text)

    def _on_text(self, text: str) -> None:
        if not text:
            return
        channel = self._channel(self._kind)
        if channel == "tool" and self._call is not None:
            self._call.unsent_args += self._call.scanner.feed(text)
            self._send_call_progress(self._call)
        else:
            self._emit_text(channel, text)

    def _close_block(self, complete: bool) -> None:
        self._decode_run()
        if self._detok is not None:
            self._on_text(self._detok.finish())
        call, self._call = self._call, None
        if call is not None:
            parsed = None
            if complete:
                parsed = interpret_tool_call(self._tok, call.header_ids, self._payload, self._tml_parser)
            if parsed is not None:
                self._finish_call(call, *parsed)
        self._mode, self._kind, self._payload, self._detok = _HEADER, "", [], None

    def _flush_orphan_header(self) -> None:
        text = self._tok.decode(self._header)
        self._header = []
        if text.strip():
            self._emit_text("content", text)

    # -- tool calls --------------------------------------------------------------------------------

    def _call_name(self, call: _PendingCall) -> str | None:
        # The JSON's "name" is what a grammar constrains, so it wins; the header is the fallback once
        # the object has closed without one.
        if call.scanner.json_name:
            return call.scanner.json_name.strip() or None
        if call.scanner.closed:
            return call.header_name or None
        return None

    def _send_call_progress(self, call: _PendingCall) -> None:
        if call.index is None:
            name = self._call_name(call)
            if not call.unsent_args or name is None:
                return
            call.index, call.id, call.name = self._calls_sent, new_tool_call_id(), name
            self._calls_sent += 1
            self._emit_call(
                ToolCallDelta(index=call.index, id=call.id, name=name, arguments=call.unsent_args)
            )
        elif call.unsent_args:
            self._emit_call(ToolCallDelta(index=call.index, arguments=call.unsent_args))
        call.unsent_args = ""

    def _finish_call(self, call: _PendingCall, name: str, args: dict) -> None:
        raw = call.scanner.args_text if call.scanner.args_complete else ""
        try:
            same = bool(raw) and json.loads(raw) == args
        except ValueError:
            same = False
        if call.index is None:
            # Never streamed (name or args only known at the end): send the whole call now.
            call.index, call.id, call.name = self._calls_sent, new_tool_call_id(), name
            self._calls_sent += 1
            arguments = raw if same else json.dumps(args, ensure_ascii=False)
            self._emit_call(ToolCallDelta(index=call.index, id=call.id, name=name, arguments=arguments))
        else:
            self._send_call_progress(call)
            # What was streamed is what the final parse reports, as long as it means the same args.
            arguments = raw if same else json.dumps(args, ensure_ascii=False)
        self._tool_calls.append(ToolCall(id=call.id, name=call.name, arguments=arguments))

    # -- output ------------------------------------------------------------------------------------

    def _emit_text(self, channel: str, text: str) -> None:
        if channel == "reasoning":
            self._reasoning.append(text)
            last = self._out[-1] if self._out else None
            if last is not None and last.reasoning_content is not None:
                last.reasoning_content += text
            else:
                self._out.append(Delta(reasoning_content=text))
        else:
            self._content.append(text)
            last = self._out[-1] if self._out else None
            if last is not None and last.content is not None:
                last.content += text
            else:
                self._out.append(Delta(content=text))

    def _emit_call(self, delta: ToolCallDelta) -> None:
        last = self._out[-1] if self._out else None
        if (
            last is not None
            and last.tool_calls
            and delta.id is None
            and last.tool_calls[-1].index == delta.index
        ):
            last.tool_calls[-1].arguments += delta.arguments
        else:
            self._out.append(Delta(tool_calls=[delta]))

    def _take(self) -> list[Delta]:
        out, self._out = self._out, []
        return out
