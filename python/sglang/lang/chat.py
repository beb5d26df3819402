"""A program's chat messages, rendered as TMLv0 by tml-renderers (through `sgl_inkling.chat`).

The state keeps OpenAI-style messages plus the one message being written (role and content so far).
Two ways to continue it, both built from the real renderer, never from a hand-written template:

- open turn: an assistant message with nothing in it yet. The prompt is the rendered conversation,
  which ends with the last message's `<|end_message|>`; the model opens its own turn
  (`<|message_model|>`, possibly thinking first), and the visible text is what `parse_output` finds.
- text block: a message with content already (or a `select`, which scores text). The prompt is the
  conversation rendered with that partial message, minus the closing framing tokens, so the model
  continues inside the message's `<|content_text|>` block.

Images and audio are OpenAI-style parts of a message; a conversation with any is rendered as the
chat endpoint renders it (see `_render_media_ids`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from sglang.lang import media as media_mod

ROLES = ("system", "user", "assistant")


class ChatProgramError(ValueError):
    """A program mixes chat roles and text in a way TMLv0 cannot express."""


def _chat():
    # Imported on first use: tml-renderers pulls in torch, and `import sglang` must stay cheap.
    from sgl_inkling.chat import output_parser, render, tokenizer

    return render, output_parser, tokenizer.get_tokenizer()


@dataclass
class ChatTranscript:
    reasoning_effort: float | str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    role: str | None = None  # the message being written, if any
    content: str = ""  # the open message's text after its last media part
    parts: list[dict[str, Any]] = field(default_factory=list)  # the open message's parts before that

    def copy(self) -> ChatTranscript:
        return copy.deepcopy(self)

    # ---------------------------------------------------------------- building

    def begin(self, role: str) -> None:
        if role not in ROLES:
            raise ChatProgramError(f"unknown role {role!r}; use one of {ROLES}")
        if self.role is not None:
            raise ChatProgramError(f"{role}_begin() inside an open {self.role} message; end it first")
        self.role, self.content, self.parts = role, "", []

    def add_media(self, item: media_mod.Media) -> None:
        if self.role is None:
            raise ChatProgramError(
                f"sgl.{item.kind} outside a role in a chat program: put it inside sgl.user(...) etc."
            )
        if self.content:
            self.parts.append({"type": "text", "text": self.content})
        self.content = ""
        if item.kind == "image":
            self.parts.append({"type": "image_url", "image_url": {"url": item.url}})
        else:
            payload = item.url.partition(",")[2]  # OpenAI's input_audio takes bare base64
            self.parts.append({"type": "input_audio", "input_audio": {"data": payload}})

    def _open_message(self, extra: str = "") -> dict[str, Any]:
        text = self.content + extra
        if not self.parts:
            return {"role": self.role, "content": text}
        tail = [{"type": "text", "text": text}] if text else []
        return {"role": self.role, "content": [*self.parts, *tail]}

    def append(self, text: str) -> None:
        if self.role is None:
            raise ChatProgramError(
                "text outside a role in a chat program: put it inside sgl.system/user/assistant(...)"
            )
        self.content += text

    def end(self, role: str) -> None:
        if self.role != role:
            raise ChatProgramError(f"{role}_end() without a matching {role}_begin() (open: {self.role})")
        self.messages.append(self._open_message())
        self.role, self.content, self.parts = None, "", []

    @property
    def in_open_turn(self) -> bool:
        """An assistant message with nothing in it yet: the model opens the turn itself."""
        return self.role == "assistant" and not self.content and not self.parts and bool(self.messages)

    # ---------------------------------------------------------------- rendering

    def _render_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        if any(isinstance(m["content"], list) for m in messages):
            return self._render_media_ids(messages)
        render, _, tok = _chat()
        return render.render_chat(messages, reasoning_effort=self.reasoning_effort, tokenizer=tok).input_ids

    def _render_media_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The chat endpoint's own path (decode the media, render, expand to one placeholder per
        patch or frame), then each item collapsed back to ONE placeholder: the request carries the
        media and the server widens each placeholder again."""
        render, _, tok = _chat()
        proc = media_mod.processor()
        rendered, images = proc.chat_messages(messages)
        prompt = render.render_chat(
            rendered, reasoning_effort=self.reasoning_effort, tokenizer=tok, allow_media=True
        )
        ids, items = proc.expand_chat(prompt.spans, images)
        return media_mod.collapse(ids, items)

    def open_turn_prompt(self) -> list[int]:
        return self._render_ids(self.messages)

    def text_block_prompt(self, extra: str = "") -> list[int]:
        """The conversation with the open message (content + `extra`), left open after its text."""
        if self.role is None:
            raise ChatProgramError(
                "gen/select in a chat program must be inside a role, e.g. sgl.assistant(sgl.gen())"
            )
        ids = self._render_ids([*self.messages, self._open_message(extra)])
        # Content is ordinary text (never encoded as specials), so these trailing ids are the message's
        # closing framing, which the continuation must not see; the opening framing stays.
        fr = _chat()[2].framing
        closing = {fr.end_message, *fr.end_of_turn}
        while ids and ids[-1] in closing:
            ids.pop()
        return ids

    def text(self) -> str:
        """The conversation as the model sees it, special tokens spelled out."""
        _, _, tok = _chat()
        if self.role is not None and (self.content or self.parts):
            return tok.decode(self.text_block_prompt())
        return tok.decode(self._render_ids(self.messages)) if self.messages else ""

    # ---------------------------------------------------------------- parsing

    @staticmethod
    def text_block_opener() -> list[int]:
        """What precedes generated ids when the model continues a text block (for the parser)."""
        _, _, tok = _chat()
        return [tok.framing.content_text]

    @staticmethod
    def parser():
        """A streaming TMLv0 output parser (reasoning kept apart from the visible content). Programs
        declare no tools, so a header-less block is text from its first token (as chat without tools)."""
        from sgl_inkling.chat.stream_parser import StreamingOutputParser

        return StreamingOutputParser(_chat()[2], separate_reasoning=True, tool_headers=False)

    @staticmethod
    def end_message_id() -> int:
        return _chat()[2].framing.end_message
