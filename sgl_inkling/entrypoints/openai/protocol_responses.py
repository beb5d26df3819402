"""The OpenAI Responses API (/v1/responses): the request model, and its input as chat messages.

A Responses request is a chat request in other clothes: `instructions` is the system message, input
items are messages, function calls and their outputs, and reasoning sent back; `previous_response_id`
prepends a stored conversation. Translating it here lets the chat path (renderer, TMLv0 grammar for
tools, output parser) serve it unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from sgl_inkling.chat import ChatRequestError
from sgl_inkling.entrypoints.openai.protocol import _Request


class ResponsesTool(_Request):
    type: Literal["function"]  # built-in tools (web search, files, computer use) do not exist here
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunctionByName(_Request):
    type: Literal["function"]
    name: str


class Reasoning(_Request):
    effort: str | None = None
    # No summarizer here: "auto" (the server's choice) gives the reasoning item its full text, no summary.
    summary: Literal["auto"] | None = None
    generate_summary: Literal["auto"] | None = None


class TextFormat(_Request):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Request):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # only the neutral value: there is no verbosity knob


class ResponsesRequest(_Request):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunctionByName | None = None
    parallel_tool_calls: bool = True
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Accepted only at their neutral values (anything else asks for something that does not exist here).
    truncation: Literal["disabled"] | None = None
    background: Literal[False] = False
    include: list[str] | None = Field(default=None, max_length=0)
    top_logprobs: Literal[0] | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponsesRequest:
        if isinstance(self.tool_choice, ToolChoiceFunctionByName):
            if self.tool_choice.name not in {t.name for t in self.tools or []}:
                raise ValueError(f"tool_choice names {self.tool_choice.name!r}, which is not in tools")
        elif self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools to choose from")
        return self


def chat_fields(req: ResponsesRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The ChatCompletionRequest fields equivalent to `req` over `messages`."""
    fields: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "stream": req.stream,
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
        "reasoning_effort": req.reasoning.effort if req.reasoning else None,
        "user": req.user,
    }
    if req.tools:
        fields["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)} for t in req.tools
        ]
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceFunctionByName):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        fields["tool_choice"] = choice
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_}}
    return fields


_PART_TYPES = {"input_text": "text", "output_text": "text", "text": "text"}


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatRequestError(f"{where}.content must be a string or a list of content parts")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _PART_TYPES:
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        else:
            raise ChatRequestError(f"{where}.content[{j}]: unsupported content part type {kind!r}")
    return parts


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items as chat messages (function calls join the assistant turn they follow)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item belongs to the assistant turn after it

    def assistant() -> dict[str, Any]:
        nonlocal reasoning
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant" or reasoning is not None:
            last = {"role": "assistant", "content": ""}
            if reasoning is not None:
                last["reasoning_content"], reasoning = reasoning, None
            messages.append(last)
        return last

    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                msg = assistant()
                text = _content(item.get("content", ""), where)
                msg["content"] = text if isinstance(text, str) else "".join(p.get("text", "") for p in text)
            else:
                messages.append({"role": role, "content": _content(item.get("content", ""), where)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}  # fmt: skip
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else str(output)})  # fmt: skip
        elif kind == "reasoning":
            texts = [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
            texts = texts or [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)]
            reasoning = "".join(texts)
        else:
            raise ChatRequestError(f"{where}: unsupported input item type {kind!r}")
    return messages


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int
