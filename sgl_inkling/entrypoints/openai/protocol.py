"""Pydantic models of the OpenAI-compatible API: requests, responses, stream chunks, errors.

Requests are validated strictly from JSON (a string where a number belongs is a 400, as on OpenAI's
own API) while unknown fields are ignored: OpenAI clients send extras this server has no use for.
Responses are plain models; stream chunks are dumped without their None fields, so a delta carries
only what changed.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


def random_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- errors, models, usage -------------------------------------------------------------------------


class ErrorResponse(_Response):
    object: Literal["error"] = "error"
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "sglang"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


class PromptTokensDetails(_Response):
    cached_tokens: int = 0


class UsageInfo(_Response):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None  # set with --enable-cache-report


class StreamOptions(_Request):
    include_usage: bool = False


# -- shared request fields -------------------------------------------------------------------------


class JsonSchemaSpec(_Request):
    name: str | None = None
    description: str | None = None
    # `schema` would shadow a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("response_format of type 'json_schema' needs json_schema.schema")
        return self


class SamplingFields(_Request):
    """Fields common to both generation endpoints (OpenAI's plus SGLang's extras)."""

    model: str | None = None
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = Field(default=None, ge=0)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    response_format: ResponseFormat | None = None
    regex: str | None = None
    ebnf: str | None = None
    user: str | None = None
    data_parallel_rank: int | None = None  # SGLang's: pin to one --dp-size replica (sglang-router --dp-aware)


# -- /v1/completions -------------------------------------------------------------------------------


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)  # OpenAI's documented default
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="after")
    def _prompt_not_empty(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and (not self.prompt or any(p == [] for p in self.prompt)):
            raise ValueError("prompt must not be an empty list")
        return self


class CompletionLogprobs(_Response):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None
    matched_stop: int | str | None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# A stream chunk has the same shape as a response (OpenAI uses one object type for both).
CompletionStreamResponse = CompletionResponse


# -- /v1/chat/completions --------------------------------------------------------------------------


class FunctionDefinition(_Request):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ToolChoiceFunctionName(_Request):
    name: str


class ToolChoiceFunction(_Request):
    type: Literal["function"] = "function"
    function: ToolChoiceFunctionName


class ChatCompletionRequest(SamplingFields):
    # Messages stay plain dicts: the chat renderer owns their validation (roles, parts, tool calls).
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool = True
    reasoning_effort: str | float | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    separate_reasoning: bool = True

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        choice = self.tool_choice
        if choice in ("required",) or isinstance(choice, ToolChoiceFunction):
            if not self.tools:
                raise ValueError("tool_choice needs tools to choose from")
        if isinstance(choice, ToolChoiceFunction):
            names = {t.function.name for t in self.tools or []}
            if choice.function.name not in names:
                raise ValueError(f"tool_choice names {choice.function.name!r}, which is not in tools")
        return self


class FunctionCall(_Response):
    name: str | None = None
    arguments: str | None = None


class ToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Response):
    content: list[TokenLogprob] | None = None


class ChatCompletionChoice(_Response):
    index: int
    message: ChatMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    matched_stop: int | str | None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo | None = None


class ToolCallDeltaFunction(_Response):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Response):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallDeltaFunction


class DeltaMessage(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatCompletionStreamChoice(_Response):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    matched_stop: int | str | None = None


class ChatCompletionStreamResponse(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None
