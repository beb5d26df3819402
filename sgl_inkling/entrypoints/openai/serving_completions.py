"""POST /v1/completions: raw prompts (text or token ids, one or many), plain and streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi.responses import JSONResponse, Response

from sgl_inkling.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    random_id,
)
from sgl_inkling.entrypoints.openai.serving_base import (
    SSE_DONE,
    Choice,
    ClosingStreamingResponse,
    TokenizerManager,
    check_model,
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

LogprobEntry = Sequence[Any]  # (logprob | None, token_id, text | None)


def _prompts(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> list[tuple[str | None, list[int] | None]]:
    """Each prompt as (text, None) or (None, token ids)."""
    if isinstance(prompt, str):
        return [(prompt, None)]
    if all(isinstance(p, int) for p in prompt):
        return [(None, list(prompt))]  # type: ignore[arg-type]
    return [(p, None) if isinstance(p, str) else (None, list(p)) for p in prompt]  # type: ignore[misc]


def token_text(tokenizer: Any, entry: LogprobEntry) -> str:
    text = entry[2] if len(entry) > 2 else None
    return text if isinstance(text, str) else tokenizer.decode([int(entry[1])])


def completion_logprobs(
    tokenizer: Any,
    entries: Sequence[LogprobEntry],
    tops: Sequence[Sequence[LogprobEntry] | None] | None,
    offset: int,
) -> CompletionLogprobs:
    """OpenAI's completions logprobs: parallel lists, with text offsets starting at `offset`."""
    out = CompletionLogprobs()
    for i, entry in enumerate(entries):
        text = token_text(tokenizer, entry)
        out.tokens.append(text)
        out.token_logprobs.append(None if entry[0] is None else float(entry[0]))
        top = tops[i] if tops is not None and i < len(tops) else None
        out.top_logprobs.append(
            None if top is None else {token_text(tokenizer, t): float(t[0]) for t in top if t[0] is not None}
        )
        out.text_offset.append(offset)
        offset += len(text)
    return out


def _build_choices(tm: TokenizerManager, req: CompletionRequest) -> list[Choice]:
    sp = sampling_params(req, req.max_tokens)
    want_logprobs = req.logprobs is not None
    choices: list[Choice] = []
    for p, (text, ids) in enumerate(_prompts(req.prompt)):
        for j in range(req.n):
            obj = GenerateReqInput(
                text=text,
                input_ids=ids,
                sampling_params=dict(sp),
                stream=req.stream,
                return_logprob=want_logprobs,
                top_logprobs_num=req.logprobs or 0,
                # Echoed prompts are scored too, which needs logprobs from the first prompt token.
                logprob_start_len=0 if req.echo and want_logprobs else -1,
                return_text_in_logprobs=True,
                data_parallel_rank=req.data_parallel_rank,
            )
            c = make_choice(p * req.n + j, obj)
            if req.echo:
                c.extra["echo"] = text if text is not None else tm.tokenizer.decode(ids)
            choices.append(c)
    return choices


def _echo_logprobs(tm: TokenizerManager, meta: dict, offset: int) -> CompletionLogprobs:
    return completion_logprobs(
        tm.tokenizer, meta.get("input_token_logprobs") or [], meta.get("input_top_logprobs"), offset
    )


def _extend(into: CompletionLogprobs | None, more: CompletionLogprobs) -> CompletionLogprobs:
    if into is None:
        return more
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        getattr(into, name).extend(getattr(more, name))
    return into


def _final_choice(tm: TokenizerManager, req: CompletionRequest, c: Choice) -> CompletionChoice:
    out = c.last or {}
    meta = out.get("meta_info") or {}
    prefix = c.extra.get("echo", "")
    logprobs = None
    if req.logprobs is not None:
        if req.echo:
            logprobs = _echo_logprobs(tm, meta, 0)
        gen_offset = len(prefix)
        gen = completion_logprobs(
            tm.tokenizer, meta.get("output_token_logprobs") or [], meta.get("output_top_logprobs"), gen_offset
        )
        logprobs = _extend(logprobs, gen)
    reason = finish_reason_of(out)
    return CompletionChoice(
        index=c.index,
        text=prefix + str(out.get("text") or ""),
        logprobs=logprobs,
        finish_reason=openai_finish_reason(reason),  # type: ignore[arg-type]
        matched_stop=(reason or {}).get("matched"),
    )


async def serve_completions(tm: TokenizerManager, req: CompletionRequest, raw_request: Any) -> Response:
    if (err := check_model(tm, req.model)) is not None:
        return err
    choices = _build_choices(tm, req)
    if req.stream:
        await prime_streams(tm, choices, raw_request)
        return ClosingStreamingResponse(_stream(tm, req, choices), media_type="text/event-stream")
    await run_to_completion(tm, choices, raw_request)
    response = CompletionResponse(
        id=random_id("cmpl-"),
        model=tm.model_name,
        choices=[_final_choice(tm, req, c) for c in choices],
        usage=usage_of(choices, req.n, tm.enable_cache_report),
    )
    return JSONResponse(response.model_dump())


def _stream_delta(
    tm: TokenizerManager, req: CompletionRequest, c: Choice, out: dict
) -> CompletionChoice | None:
    """The chunk for one new cumulative output of a choice, or None when nothing changed."""
    meta = out.get("meta_info") or {}
    st = c.extra.setdefault("stream", {"text": 0, "logprobs": 0, "offset": 0, "started": False})
    text = str(out.get("text") or "")
    # Cumulative text only grows; if the engine ever rewrites its tail, nothing already sent is repeated.
    delta = text[st["text"] :] if len(text) > st["text"] else ""
    st["text"] = max(st["text"], len(text))
    logprobs = None
    if not st["started"]:
        st["started"] = True
        prefix = c.extra.get("echo", "")
        delta = prefix + delta
        if req.echo and req.logprobs is not None:
            logprobs = _echo_logprobs(tm, meta, 0)
        st["offset"] = len(prefix)
    if req.logprobs is not None:
        entries = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        new = completion_logprobs(
            tm.tokenizer, entries[st["logprobs"] :], tops[st["logprobs"] :], st["offset"]
        )
        st["logprobs"] = len(entries)
        if new.text_offset:
            st["offset"] = new.text_offset[-1] + len(new.tokens[-1])
        logprobs = _extend(logprobs, new)
    reason = finish_reason_of(out)
    if not delta and reason is None and not (logprobs and logprobs.tokens):
        return None
    return CompletionChoice(
        index=c.index,
        text=delta,
        logprobs=logprobs,
        finish_reason=openai_finish_reason(reason),  # type: ignore[arg-type]
        matched_stop=(reason or {}).get("matched") if reason else None,
    )


async def _stream(tm: TokenizerManager, req: CompletionRequest, choices: list[Choice]) -> AsyncIterator[str]:
    rid = random_id("cmpl-")
    merged = merge_streams(tm, choices)
    try:
        async for c, out in merged:
            failed = take_output(c, out)
            if failed is not None:
                yield failed
                break
            choice = _stream_delta(tm, req, c, out)
            if choice is not None:
                chunk = CompletionResponse(id=rid, model=tm.model_name, choices=[choice])
                yield sse(chunk.model_dump(exclude_none=True))
        else:
            if req.stream_options is not None and req.stream_options.include_usage:
                usage = CompletionResponse(
                    id=rid, model=tm.model_name, choices=[], usage=usage_of(choices, req.n, tm.enable_cache_report)
                )
                yield sse(usage.model_dump(exclude_none=True))
        yield SSE_DONE
    finally:
        await merged.aclose()
