"""What both generation endpoints share: the engine interface, errors, sampling params, fan-out of n.

Every choice of a request (n of them, times the prompts of a completions batch) is one single
engine request with its own rid, run concurrently. Whatever way a request ends early (an error in
one choice, the client going away, the server cancelling the handler) the unfinished choices are
aborted in the engine, so no sequence keeps decoding for nobody.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from sgl_inkling.entrypoints.openai.protocol import ErrorResponse, SamplingFields, UsageInfo
from sgl_inkling.managers.io_struct import GenerateReqInput, RequestError, new_rid


class TokenizerManager(Protocol):
    """The engine front the HTTP layer talks to (SGLang's TokenizerManager, duck-typed)."""

    model_name: str
    context_len: int
    tokenizer: Any  # sgl_inkling.chat.tokenizer.InklingTokenizer
    reasoning_parser: str | None
    tool_call_parser: str | None
    enable_cache_report: bool  # --enable-cache-report: cached prompt tokens in the usage

    def generate_request(self, obj: GenerateReqInput, request: Any = None) -> AsyncIterator[Any]:
        """An async generator: cumulative output dicts (see the module docs of the router)."""
        ...

    def abort_request(self, rid: str) -> None: ...


# -- errors ----------------------------------------------------------------------------------------

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 413: "RequestTooLargeError"}


def error_body(message: str, status_code: int = 400, param: str | None = None, code: Any = None) -> dict:
    kind = _ERROR_TYPES.get(status_code, "BadRequestError" if status_code < 500 else "InternalServerError")
    return ErrorResponse(
        message=message, type=kind, param=param, code=status_code if code is None else code
    ).model_dump()


def error_response(message: str, status_code: int = 400, param: str | None = None, code: Any = None):
    return JSONResponse(error_body(message, status_code, param, code), status_code=status_code)


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    """A readable one-line message and the offending parameter of a pydantic error."""
    errors = e.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        return f"malformed JSON body: {errors[0]['msg']}", None
    parts, param = [], None
    for err in errors[:3]:
        loc = ".".join(str(x) for x in err["loc"])
        param = param or loc or None
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts) or "invalid request", param


def check_model(tm: TokenizerManager, model: str | None) -> JSONResponse | None:
    if model is None or model == tm.model_name:
        return None
    return error_response(
        f"The model `{model}` does not exist; this server serves `{tm.model_name}`.",
        404,
        param="model",
        code="model_not_found",
    )


def abort_error(finish_reason: dict) -> RequestError:
    """An engine abort becomes an error: its status when it has one (4xx refused, 5xx failed), else 400."""
    status = finish_reason.get("status_code")
    status = status if isinstance(status, int) and 400 <= status < 600 else 400
    return RequestError(str(finish_reason.get("message") or "request aborted"), status)


# -- sampling parameters ---------------------------------------------------------------------------

# OpenAI name -> SGLang native name, for the fields passed through unchanged.
_PASS_THROUGH = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "logit_bias": "logit_bias",
    "min_tokens": "min_new_tokens",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "regex": "regex",
    "ebnf": "ebnf",
}


def sampling_params(req: SamplingFields, max_new_tokens: int | None) -> dict[str, Any]:
    """Native `sampling_params`; values are left for the engine to validate (its errors name fields)."""
    sp: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for openai_name, native in _PASS_THROUGH.items():
        value = getattr(req, openai_name)
        if value is not None:
            sp[native] = value
    # OpenAI treats "" and [] as "no stop sequence".
    if isinstance(req.stop, str) and req.stop:
        sp["stop"] = req.stop
    elif isinstance(req.stop, list) and req.stop:
        sp["stop"] = list(req.stop)
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        sp["json_schema"] = json.dumps({"type": "object"})
    elif rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
        sp["json_schema"] = json.dumps(rf.json_schema.schema_)
    return sp


# -- running choices -------------------------------------------------------------------------------


@dataclass
class Choice:
    """One engine request behind one OpenAI choice."""

    index: int
    obj: GenerateReqInput
    gen: AsyncIterator[Any] | None = None
    first: dict | None = None  # the primed first output of a stream
    last: dict | None = None
    finished: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # per-endpoint streaming state

    @property
    def rid(self) -> str:
        return str(self.obj.rid)


def make_choice(index: int, obj: GenerateReqInput) -> Choice:
    obj.rid = new_rid()
    return Choice(index, obj)


def finish_reason_of(out: dict) -> dict | None:
    return (out.get("meta_info") or {}).get("finish_reason")


def abort_unfinished(tm: TokenizerManager, choices: Sequence[Choice]) -> None:
    for c in choices:
        if not c.finished:
            c.finished = True
            tm.abort_request(c.rid)


async def _close(choices: Sequence[Choice]) -> None:
    for c in choices:
        if c.gen is not None and hasattr(c.gen, "aclose"):
            try:
                await c.gen.aclose()
            except Exception:  # a generator still running elsewhere, or its cleanup failing: ignore
                pass


async def _cleanup(tm: TokenizerManager, choices: Sequence[Choice], tasks: Sequence[asyncio.Task]) -> None:
    # Abort first and synchronously: it must happen even if the awaits below get cancelled.
    abort_unfinished(tm, choices)
    for t in tasks:
        t.cancel()
    # Starlette cancels a disconnected stream through an anyio scope, which would cancel these awaits
    # again; the shield lets the engine's generators finish their own cleanup.
    with anyio.CancelScope(shield=True):
        await asyncio.gather(*tasks, return_exceptions=True)
        await _close(choices)


async def _all_or_none(tm: TokenizerManager, choices: list[Choice], work) -> None:
    """Run work(choice) for every choice; on the first failure cancel and abort the rest, re-raise."""
    tasks = [asyncio.ensure_future(work(c)) for c in choices]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        if any(t.cancelled() for t in tasks):
            # The engine cancels a request whose client went away; nobody reads this answer.
            raise RequestError("the request was cancelled (client disconnected)", 499)
    except BaseException:
        await _cleanup(tm, choices, tasks)
        raise


async def run_to_completion(tm: TokenizerManager, choices: list[Choice], request: Any) -> None:
    """Non-streaming: run every choice concurrently to its final output (in `choice.last`)."""

    async def one(c: Choice) -> None:
        c.gen = tm.generate_request(c.obj, request)
        async for out in c.gen:
            c.last = out
        c.finished = True
        if c.last is None:
            raise RequestError("the engine returned no output for the request", 400)
        reason = finish_reason_of(c.last)
        if reason and reason.get("type") == "abort":
            raise abort_error(reason)

    await _all_or_none(tm, choices, one)


async def prime_streams(tm: TokenizerManager, choices: list[Choice], request: Any) -> None:
    """Start every stream and wait for its first output, so that a request the engine refuses gets
    a proper HTTP status before the 200 of the event stream is committed."""

    async def one(c: Choice) -> None:
        c.gen = tm.generate_request(c.obj, request)
        c.first = await anext(c.gen, None)
        if c.first is None:
            c.finished = True

    await _all_or_none(tm, choices, one)


_END = object()


async def merge_streams(tm: TokenizerManager, choices: list[Choice]) -> AsyncIterator[tuple[Choice, Any]]:
    """Yield (choice, output) from all primed streams as they arrive; yields (choice, exception)
    when a stream fails. Closing this generator early (client gone) aborts what is unfinished."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(c: Choice) -> None:
        try:
            if c.first is not None:
                await queue.put((c, c.first))
            if c.gen is not None and c.first is not None:
                async for out in c.gen:
                    await queue.put((c, out))
        except Exception as e:  # delivered in order, so the client sees what went wrong
            await queue.put((c, e))
        finally:
            await queue.put((c, _END))

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    live = len(tasks)
    try:
        while live:
            c, item = await queue.get()
            if item is _END:
                live -= 1
                continue
            yield c, item
    finally:
        await _cleanup(tm, choices, tasks)


class ClosingStreamingResponse(StreamingResponse):
    """Closes its body generator however the response ends, so the generator's cleanup (aborting the
    engine requests) runs at once even when the server reports a disconnect as a failed send."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


def take_output(c: Choice, out: Any) -> str | None:
    """Record one output of merge_streams on its choice. Returns the SSE error event that ends the
    stream when the output is a failure or an abort, else None."""
    if isinstance(out, BaseException):
        return stream_error(out)
    c.last = out
    reason = finish_reason_of(out)
    if reason is not None:
        c.finished = True
        if reason.get("type") == "abort":
            return stream_error(abort_error(reason))
    return None


def stream_error(e: BaseException) -> str:
    """The SSE event for a failure after the stream started (the openai client raises on it)."""
    if isinstance(e, RequestError):
        return sse({"error": error_body(e.message, e.status_code)})
    return sse({"error": error_body(f"internal error: {e}", 500)})


# -- output helpers --------------------------------------------------------------------------------


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def usage_of(choices: Sequence[Choice], n: int, cache_report: bool) -> UsageInfo:
    """Prompt tokens count once per prompt (its first choice), completion tokens for every choice;
    cached prompt tokens only with --enable-cache-report (upstream's rule)."""
    prompt = cached = completion = 0
    for c in choices:
        meta = ((c.last or c.first) or {}).get("meta_info") or {}
        completion += int(meta.get("completion_tokens") or 0)
        if c.index % n == 0:
            prompt += int(meta.get("prompt_tokens") or 0)
            cached += int(meta.get("cached_tokens") or 0)
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details={"cached_tokens": cached} if cache_report else None,
    )


def openai_finish_reason(reason: dict | None) -> str | None:
    if not reason:
        return None
    return "length" if reason.get("type") == "length" else "stop"
