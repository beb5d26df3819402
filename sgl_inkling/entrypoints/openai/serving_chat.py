"""POST /v1/chat/completions: TMLv0 prompts from the chat renderer, output parsed from token ids.

Output is parsed from `output_ids`, never from text: the TMLv0 framing tokens are what separate
thinking, visible text and tool calls, and the engine's text has them stripped. Reasoning goes to
`reasoning_content` only when the server runs a reasoning parser (SGLang's rule); tool calls are
parsed when it runs a tool-call parser and the request declares tools.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, Response

from sgl_inkling.chat import ChatRequestError, Delta, RenderedPrompt, StreamingOutputParser, render_chat
from sgl_inkling.chat.output_parser import ParsedOutput
from sgl_inkling.constrained import GrammarError, chat_grammar
from sgl_inkling.entrypoints.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    ChoiceLogprobs,
    DeltaMessage,
    FunctionCall,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolCallDeltaFunction,
    TopLogprob,
    random_id,
)
from sgl_inkling.entrypoints.openai.serving_base import (
    SSE_DONE,
    Choice,
    ClosingStreamingResponse,
    TokenizerManager,
    check_model,
    error_response,
    finish_reason_of,
    make_choice,
    merge_streams,
    openai_finish_reason,
    prime_streams,
    run_to_completion,
    sampling_params,
    sse,
    take_output,
    usage_of,
)
from sgl_inkling.managers.io_struct import GenerateReqInput
from sgl_inkling.multimodal import MediaError


@dataclass(frozen=True)
class _Setup:
    prompt: RenderedPrompt
    separate_reasoning: bool
    parse_tool_calls: bool
    tool_headers: bool  # tools declared: a block's header may be a tool name (held back from content)

    def parser(self, tm: TokenizerManager) -> StreamingOutputParser:
        return StreamingOutputParser(
            tm.tokenizer,
            separate_reasoning=self.separate_reasoning,
            parse_tool_calls=self.parse_tool_calls,
            tml_parser=self.prompt.parser,
            tool_headers=self.tool_headers,
        )


def _forces_call(tool_choice: Any) -> bool:
    return tool_choice == "required" or (not isinstance(tool_choice, str) and tool_choice is not None)


def _tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    # tool_choice "none" hides the tools from the model altogether, as SGLang does.
    if not req.tools or req.tool_choice == "none":
        return None
    tools = []
    for t in req.tools:
        fn = t.function.model_dump(exclude_none=True)
        # OpenAI allows a function without parameters; the renderer wants a schema object.
        fn.setdefault("parameters", {"type": "object", "properties": {}})
        tools.append({"type": "function", "function": fn})
    return tools


def _build(tm: TokenizerManager, req: ChatCompletionRequest) -> tuple[_Setup, list[Choice]]:
    tools = _tools(req)
    messages, images = tm.media.chat_messages(req.messages)
    prompt = render_chat(
        messages,
        tools,
        req.reasoning_effort,
        chat_template_kwargs=req.chat_template_kwargs,
        tokenizer=tm.tokenizer,
        allow_media=True,
    )
    input_ids, mm_items = tm.media.expand_chat(prompt.spans, images) if prompt.has_media else (prompt.input_ids, None)
    max_new = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_new is None:
        # Unbounded but for the context (SGLang's chat default); the prompt length is known here.
        max_new = max(tm.context_len - len(input_ids), 0)
    sp = sampling_params(req, max_new)
    # The engine stops at the tokenizer's end ids itself; add only what the renderer wants beyond them.
    eos = set(getattr(tm.tokenizer, "eos_token_ids", []) or [])
    extra_stops = [t for t in prompt.stop_token_ids if t not in eos]
    if extra_stops and not req.ignore_eos:
        sp["stop_token_ids"] = list(sp.get("stop_token_ids") or []) + extra_stops
    # TMLv0-framed grammar: response_format constrains the text block, tools the tool-call blocks.
    grammar = chat_grammar(
        tm.tokenizer,
        json_schema=sp.get("json_schema"),
        regex=sp.get("regex"),
        ebnf=sp.get("ebnf"),
        tools=tools,
        tool_choice=req.tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        thinking=prompt.reasoning_effort > 0,
    )
    choices = [
        make_choice(
            i,
            GenerateReqInput(
                input_ids=list(input_ids),
                mm_items=mm_items,
                sampling_params=dict(sp),
                stream=req.stream,
                return_logprob=req.logprobs,
                top_logprobs_num=req.top_logprobs or 0,
                return_text_in_logprobs=True,
                grammar=grammar,
                data_parallel_rank=req.data_parallel_rank,
            ),
        )
        for i in range(req.n)
    ]
    setup = _Setup(
        prompt=prompt,
        separate_reasoning=bool(tm.reasoning_parser) and req.separate_reasoning,
        # A forced call (required / named) is what the client asked for: tool_calls even without a parser.
        parse_tool_calls=tools is not None and (bool(tm.tool_call_parser) or _forces_call(req.tool_choice)),
        tool_headers=tools is not None,
    )
    return setup, choices


async def serve_chat(tm: TokenizerManager, req: ChatCompletionRequest, raw_request: Any) -> Response:
    if (err := check_model(tm, req.model)) is not None:
        return err
    try:
        setup, choices = _build(tm, req)
    except (ChatRequestError, MediaError) as e:
        return error_response(str(e), 400, param="messages")
    except GrammarError as e:
        return error_response(str(e), 400)
    if req.stream:
        await prime_streams(tm, choices, raw_request)
        return ClosingStreamingResponse(_stream(tm, req, setup, choices), media_type="text/event-stream")
    await run_to_completion(tm, choices, raw_request)
    response = ChatCompletionResponse(
        id=random_id("chatcmpl-"),
        model=tm.model_name,
        choices=[_final_choice(tm, req, setup, c) for c in choices],
        usage=usage_of(choices, req.n, tm.enable_cache_report),
    )
    return JSONResponse(response.model_dump())


# -- shared by both paths --------------------------------------------------------------------------


def _coalesce(deltas: Sequence[Delta]) -> list[Delta]:
    """Join neighbouring text deltas of one channel (feed() and finish() batch separately)."""
    out: list[Delta] = []
    for d in deltas:
        prev = out[-1] if out else None
        if prev is not None and d.content is not None and prev.content is not None:
            prev.content += d.content
        elif prev is not None and d.reasoning_content is not None and prev.reasoning_content is not None:
            prev.reasoning_content += d.reasoning_content
        else:
            out.append(d)
    return out


def _trim_stop(deltas: Sequence[Delta], parsed: ParsedOutput, stop: str) -> None:
    """The engine's text is cut before a matched stop string but its output ids are not: cut the
    channel written last (in `parsed` and in its last delta) where the stop string starts."""
    last = next(
        (d for d in reversed(deltas) if d.content is not None or d.reasoning_content is not None), None
    )
    if last is None:
        return
    name = "content" if last.content is not None else "reasoning_content"
    full = getattr(parsed, name) or ""
    cut = full.find(stop)  # the first occurrence, as upstream (generation stopped at it)
    if cut < 0:
        return
    start = len(full) - len(getattr(last, name))
    setattr(last, name, full[start:cut] if cut > start else "")
    setattr(parsed, name, full[:cut] if name == "content" else (full[:cut] or None))


def _chat_logprobs(tokenizer: Any, meta: dict, start: int) -> list[TokenLogprob]:
    """OpenAI chat logprobs of output positions from `start`; framing (special) tokens left out."""
    entries = (meta.get("output_token_logprobs") or [])[start:]
    tops = (meta.get("output_top_logprobs") or [])[start:]
    is_special = getattr(tokenizer, "is_special", lambda _: False)

    def top(entry: Sequence[Any]) -> TopLogprob:
        raw = _token_bytes(tokenizer, int(entry[1]))
        return TopLogprob(
            token=raw.decode("utf-8", errors="replace"), logprob=float(entry[0]), bytes=list(raw)
        )

    out = []
    for i, entry in enumerate(entries):
        if is_special(int(entry[1])) or entry[0] is None:
            continue
        first = top(entry)
        alts = tops[i] if i < len(tops) and tops[i] else []
        out.append(
            TokenLogprob(**first.model_dump(), top_logprobs=[top(t) for t in alts if t[0] is not None])
        )
    return out


def _token_bytes(tokenizer: Any, token_id: int) -> bytes:
    if hasattr(tokenizer, "token_bytes"):
        return tokenizer.token_bytes(token_id)
    return tokenizer.decode([token_id]).encode()


def _finish(reason: dict | None, has_calls: bool) -> str | None:
    finish = openai_finish_reason(reason)
    return "tool_calls" if finish == "stop" and has_calls else finish


def _matched_stop(reason: dict | None) -> Any:
    return (reason or {}).get("matched") if reason and reason.get("type") == "stop" else None


# -- non-streaming ---------------------------------------------------------------------------------


def _final_choice(
    tm: TokenizerManager, req: ChatCompletionRequest, setup: _Setup, c: Choice
) -> ChatCompletionChoice:
    out = c.last or {}
    parser = setup.parser(tm)
    deltas = _coalesce(parser.feed(out.get("output_ids") or []) + parser.finish())
    parsed = parser.result()
    reason = finish_reason_of(out)
    if isinstance(_matched_stop(reason), str):
        _trim_stop(deltas, parsed, reason["matched"])
    calls = parsed.tool_calls if req.parallel_tool_calls else parsed.tool_calls[:1]
    message = ChatMessage(
        content=parsed.content if parsed.content or not calls else None,
        reasoning_content=parsed.reasoning_content,
        tool_calls=[
            ToolCall(id=tc.id, function=FunctionCall(name=tc.name, arguments=tc.arguments)) for tc in calls
        ]
        or None,
    )
    logprobs = None
    if req.logprobs:
        logprobs = ChoiceLogprobs(content=_chat_logprobs(tm.tokenizer, out.get("meta_info") or {}, 0))
    return ChatCompletionChoice(
        index=c.index,
        message=message,
        logprobs=logprobs,
        finish_reason=_finish(reason, bool(calls)),  # type: ignore[arg-type]
        matched_stop=_matched_stop(reason),
    )


# -- streaming -------------------------------------------------------------------------------------


@dataclass
class _StreamState:
    parser: StreamingOutputParser
    n_ids: int = 0  # output ids fed to the parser so far
    n_logprobs: int = 0  # logprob entries turned into `pending` so far
    pending: list[TokenLogprob] | None = None  # logprobs not yet attached to a chunk


def _delta_message(d: Delta, parallel: bool) -> DeltaMessage | None:
    if d.tool_calls:
        calls = [
            ToolCallDelta(
                index=tc.index,
                id=tc.id,
                type="function" if tc.id else None,
                function=ToolCallDeltaFunction(name=tc.name, arguments=tc.arguments),
            )
            for tc in d.tool_calls
            if parallel or tc.index == 0
        ]
        return DeltaMessage(tool_calls=calls) if calls else None
    if d.reasoning_content:
        return DeltaMessage(reasoning_content=d.reasoning_content)
    if d.content:
        return DeltaMessage(content=d.content)
    return None


def _step(
    tm: TokenizerManager, req: ChatCompletionRequest, c: Choice, st: _StreamState, out: dict
) -> list[ChatCompletionStreamChoice]:
    """The chunks' choices for one new cumulative output of a choice."""
    ids = out.get("output_ids") or []
    deltas = st.parser.feed(ids[st.n_ids :])
    st.n_ids = max(st.n_ids, len(ids))
    reason = finish_reason_of(out)
    if reason is not None:
        deltas = _coalesce(deltas + st.parser.finish())
        if isinstance(_matched_stop(reason), str):
            _trim_stop(deltas, st.parser.result(), reason["matched"])
    if req.logprobs:
        meta = out.get("meta_info") or {}
        st.pending = (st.pending or []) + _chat_logprobs(tm.tokenizer, meta, st.n_logprobs)
        st.n_logprobs = len(meta.get("output_token_logprobs") or [])
    chunks = []
    for d in deltas:
        msg = _delta_message(d, req.parallel_tool_calls)
        if msg is not None:
            chunks.append(ChatCompletionStreamChoice(index=c.index, delta=msg, logprobs=_take(st)))
    if reason is not None:
        calls = st.parser.tool_calls if req.parallel_tool_calls else st.parser.tool_calls[:1]
        chunks.append(
            ChatCompletionStreamChoice(
                index=c.index,
                delta=DeltaMessage(),
                logprobs=_take(st),
                finish_reason=_finish(reason, bool(calls)),  # type: ignore[arg-type]
                matched_stop=_matched_stop(reason),
            )
        )
    return chunks


def _take(st: _StreamState) -> ChoiceLogprobs | None:
    # Logprobs of tokens that produced no delta (framing, held-back bytes) ride on the next chunk, so
    # the streamed logprobs add up to the non-streamed ones.
    if st.pending is None:
        return None
    lp, st.pending = ChoiceLogprobs(content=st.pending), []
    return lp


async def _stream(
    tm: TokenizerManager, req: ChatCompletionRequest, setup: _Setup, choices: list[Choice]
) -> AsyncIterator[str]:
    rid = random_id("chatcmpl-")
    states = {c.index: _StreamState(parser=setup.parser(tm)) for c in choices}

    def chunk(parts: list[ChatCompletionStreamChoice], **kw: Any) -> str:
        body = ChatCompletionStreamResponse(id=rid, model=tm.model_name, choices=parts, **kw)
        return sse(body.model_dump(exclude_none=True))

    merged = merge_streams(tm, choices)
    try:
        for c in choices:
            role = DeltaMessage(role="assistant", content="")
            yield chunk([ChatCompletionStreamChoice(index=c.index, delta=role)])
        async for c, out in merged:
            failed = take_output(c, out)
            if failed is not None:
                yield failed
                break
            for part in _step(tm, req, c, states[c.index], out):
                yield chunk([part])
        else:
            if req.stream_options is not None and req.stream_options.include_usage:
                yield chunk([], usage=usage_of(choices, req.n, tm.enable_cache_report))
        yield SSE_DONE
    finally:
        await merged.aclose()
