"""OpenAI chat request -> Inkling prompt token ids, rendered by tml-renderers (no hand-written template).

What tml-renderers does and this module only arranges:
- messages: OpenAI dicts become `chat.OpenAIMessage.from_oss_dict(...)`, flattened to `chat.Message`s;
- tools: a system-authored `chat.ToolDeclareJson([chat.ToolSpecJson(...)])` message placed first
  (tml renders it as `<|message_system|><|content_xml|>[...]<|end_message|>`);
- reasoning effort: `v0.Renderer.render_for_completion_with_effort`, which inserts the
  "Thinking effort level" system message after the leading system messages.
The rendered prompt ends with the last message's `<|end_message|>`: tml-renderers appends no
generation primer, so the model opens its turn itself (with `<|message_model|>` or header-less).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tml_renderers import chat, v0

from sgl_inkling.chat.tokenizer import InklingTokenizer, get_tokenizer

DEFAULT_REASONING_EFFORT = 0.9
MAX_REASONING_EFFORT = 0.99
# Named levels as Inkling's OpenAI-compatible API maps them ("max" and "xhigh" are the same level).
REASONING_EFFORT_LEVELS: dict[str, float] = {
    "none": 0.0,
    "minimal": 0.1,
    "low": 0.2,
    "medium": 0.7,
    "high": 0.9,
    "xhigh": 0.99,
    "max": 0.99,
}
_ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for the system role
_ROLES = {"system", "user", "assistant", "tool"}


class ChatRequestError(ValueError):
    """The request cannot be rendered; the HTTP layer answers 400 with this message."""


@dataclass(frozen=True)
class RenderedPrompt:
    input_ids: list[int]
    reasoning_effort: float
    tool_names: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    # The tml parser paired with this prompt; the output parsers use it to validate tool calls.
    parser: v0.Parser | None = field(default=None, repr=False, compare=False)
    # Raw tml spans: text spans, or image/audio spans for the multimodal path.
    spans: list[chat.TokenSpan] = field(default_factory=list, repr=False, compare=False)

    @property
    def has_media(self) -> bool:
        return any(not isinstance(s.span, chat.EncodedTextTokenSpan) for s in self.spans)


def parse_reasoning_effort(value: float | int | str | None) -> float | None:
    """A float in [0, 0.99] or a named level; None stays None (meaning: use the default)."""
    if value is None:
        return None
    if isinstance(value, bool):  # bool is an int subclass; True is not an effort
        raise ChatRequestError(f"reasoning_effort must be a number or a level name, got {value!r}")
    if isinstance(value, str):
        key = value.strip().lower()
        if key in REASONING_EFFORT_LEVELS:
            return REASONING_EFFORT_LEVELS[key]
        try:
            value = float(key)
        except ValueError:
            levels = ", ".join(REASONING_EFFORT_LEVELS)
            raise ChatRequestError(
                f"unknown reasoning_effort {value!r}; use a number in [0, {MAX_REASONING_EFFORT}] or one of: "
                f"{levels}"
            ) from None
    if not isinstance(value, (int, float)):
        raise ChatRequestError(f"reasoning_effort must be a number or a level name, got {value!r}")
    effort = float(value)
    if not (math.isfinite(effort) and 0.0 <= effort <= MAX_REASONING_EFFORT):
        raise ChatRequestError(f"reasoning_effort must be in [0, {MAX_REASONING_EFFORT}], got {value!r}")
    return effort


def resolve_reasoning_effort(
    reasoning_effort: float | int | str | None, chat_template_kwargs: Mapping[str, Any] | None
) -> float:
    """chat_template_kwargs' effort beats the top-level one; a thinking=off switch means effort 0."""
    kwargs = dict(chat_template_kwargs or {})
    for key in ("enable_thinking", "thinking"):
        switch = kwargs.get(key)
        if switch is not None and not isinstance(switch, bool):
            raise ChatRequestError(f"chat_template_kwargs.{key} must be true or false, got {switch!r}")
        if switch is False:
            return 0.0
    for candidate in (kwargs.get("reasoning_effort"), reasoning_effort):
        effort = parse_reasoning_effort(candidate)
        if effort is not None:
            return effort
    return DEFAULT_REASONING_EFFORT


def _tool_specs(tools: Sequence[Mapping[str, Any]]) -> list[chat.ToolSpecJson]:
    specs: list[chat.ToolSpecJson] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ChatRequestError(f"tools[{i}] must be an object")
        if tool.get("type", "function") != "function":
            raise ChatRequestError(f"tools[{i}]: only type 'function' is supported, got {tool.get('type')!r}")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise ChatRequestError(f"tools[{i}] is missing its 'function' object")
        name = fn.get("name")
        # The name is rendered into a message header, so it must be one plain word.
        if not isinstance(name, str) or not name or any(c.isspace() for c in name) or "<|" in name:
            raise ChatRequestError(f"tools[{i}].function.name must be a non-empty word, got {name!r}")
        if name in seen:
            raise ChatRequestError(f"tools[{i}]: duplicate tool name {name!r}")
        seen.add(name)
        params = fn.get("parameters")
        if not isinstance(params, Mapping):
            raise ChatRequestError(f"tools[{i}] ({name}) needs a 'parameters' JSON schema object")
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise ChatRequestError(f"tools[{i}].function.description must be a string")
        try:
            specs.append(chat.ToolSpecJson("function", name, description, dict(params)))
        except Exception as e:  # tml rejects schemas it cannot serialise
            raise ChatRequestError(f"tools[{i}] ({name}): {e}") from None
    return specs


def _normalise_message(i: int, msg: Any, call_names: dict[str, str]) -> dict[str, Any]:
    """Validate one OpenAI message and reshape the few fields tml's converter does not take."""
    if not isinstance(msg, Mapping):
        raise ChatRequestError(f"messages[{i}] must be an object, got {type(msg).__name__}")
    role = msg.get("role")
    role = _ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if not isinstance(role, str) or role not in _ROLES:  # a list or object is no role (and unhashable)
        raise ChatRequestError(f"messages[{i}]: unknown role {msg.get('role')!r}")
    out = dict(msg, role=role)
    content = out.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise ChatRequestError(f"messages[{i}].content must be a string, a list of parts, or null")

    if role == "assistant":
        # Thinking sent back in history is rendered as the thinking block it came from.
        tool_calls = out.get("tool_calls") or []
        if content == "" and tool_calls:
            out["content"] = content = None  # clients send "" beside tool calls; not an empty text block
        reasoning = out.pop("reasoning_content", None)
        if reasoning:
            if not isinstance(reasoning, str):
                raise ChatRequestError(f"messages[{i}].reasoning_content must be a string")
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            out["content"] = [{"type": "thinking", "thinking": reasoning}, *parts]
        if not isinstance(tool_calls, list):
            raise ChatRequestError(f"messages[{i}].tool_calls must be a list")
        for j, call in enumerate(tool_calls):
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise ChatRequestError(f"messages[{i}].tool_calls[{j}] needs function.name")
            if isinstance(call.get("id"), str):
                call_names[call["id"]] = fn["name"]
    elif role == "tool" and not out.get("name"):
        # OpenAI tool results carry only tool_call_id; the TMLv0 tool message header wants the name.
        name = call_names.get(out.get("tool_call_id") or "")
        if name:
            out["name"] = name
    return out


def _to_tml_messages(messages: Sequence[Any]) -> list[chat.Message]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise ChatRequestError("messages must be a non-empty list")
    call_names: dict[str, str] = {}
    out: list[chat.Message] = []
    for i, msg in enumerate(messages):
        normalised = _normalise_message(i, msg, call_names)
        try:
            out.extend(chat.OpenAIMessage.from_oss_dict(normalised).to_messages())
        except Exception as e:  # tml's converter raises ValueError/JSONDecodeError with useful text
            raise ChatRequestError(f"messages[{i}]: {e}") from None
    return out


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    reasoning_effort: float | int | str | None = None,
    *,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tokenizer: InklingTokenizer | None = None,
    allow_media: bool = False,
) -> RenderedPrompt:
    """Render an OpenAI-style chat request into prompt token ids.

    Raises ChatRequestError for anything the client got wrong (role, message shape, effort, tools).
    Image/audio parts produce non-text spans; they are refused unless `allow_media` (the caller
    then reads `spans`, since `input_ids` holds the text tokens only).
    """
    tokenizer = tokenizer or get_tokenizer()
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        raise ChatRequestError("chat_template_kwargs must be an object")
    effort = resolve_reasoning_effort(reasoning_effort, chat_template_kwargs)
    if tools is not None and (not isinstance(tools, Sequence) or isinstance(tools, (str, bytes))):
        raise ChatRequestError("tools must be a list")
    specs = _tool_specs(tools or [])
    tml_messages = _to_tml_messages(messages)
    if specs:
        declare = chat.Message(chat.ToolDeclareJson(specs), chat.Author(chat.AuthorKind.System))
        tml_messages.insert(0, declare)

    renderer = v0.Renderer(tokenizer.tml)
    try:
        spans, parser = renderer.render_for_completion_with_effort(tml_messages, effort)
    except Exception as e:
        raise ChatRequestError(f"cannot render the conversation: {e}") from None
    prompt = RenderedPrompt(
        input_ids=[t for s in spans if isinstance(s.span, chat.EncodedTextTokenSpan) for t in s.span.tokens],
        reasoning_effort=effort,
        tool_names=tuple(s.name for s in specs),
        stop_token_ids=tuple(int(t) for t in (renderer.stop() or []) if isinstance(t, int)),
        parser=parser,
        spans=list(spans),
    )
    if prompt.has_media and not allow_media:
        raise ChatRequestError("image and audio inputs are not supported on this endpoint")
    return prompt


def render_media_message(content: Any, tokenizer: InklingTokenizer | None = None) -> list[chat.TokenSpan]:
    """The spans of one user message holding an image or audio pointer (tml-renderers encodes audio)."""
    tokenizer = tokenizer or get_tokenizer()
    message = chat.Message(content, chat.Author(chat.AuthorKind.User))
    try:
        spans, _ = v0.Renderer(tokenizer.tml).render_for_completion([message])
    except Exception as e:
        raise ChatRequestError(f"cannot encode the media: {e}") from None
    return list(spans)
