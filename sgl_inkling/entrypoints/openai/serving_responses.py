"""POST /v1/responses (the OpenAI Responses API) through the chat path, and GET of a stored response.

The request becomes a chat request (protocol_responses) and runs through serving_chat's machinery:
the TMLv0 renderer, the grammar that constrains tool calls to the declared schemas, the output parser.
Its message becomes output items (reasoning, message, function_call); a stream's chunks become
Responses events. Stored responses (and the conversation behind them, for `previous_response_id`)
live in memory, the most recent MAX_STORED.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from sgl_inkling.chat import ChatRequestError
from sgl_inkling.constrained import GrammarError
from sgl_inkling.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, now, random_id
from sgl_inkling.entrypoints.openai.protocol_responses import ResponsesRequest, chat_fields, input_messages
from sgl_inkling.entrypoints.openai.responses_events import EventWriter
from sgl_inkling.entrypoints.openai.serving_base import (
    ClosingStreamingResponse,
    TokenizerManager,
    check_model,
    error_response,
    merge_streams,
    prime_streams,
    run_to_completion,
    take_output,
    usage_of,
    validation_message,
)
from sgl_inkling.entrypoints.openai.serving_chat import _build, _final_choice, _step, _StreamState
from sgl_inkling.multimodal import MediaError

MAX_STORED = 1024


class ResponseStore:
    """Stored responses by id, each with its conversation (input and output as chat messages)."""

    def __init__(self, capacity: int = MAX_STORED):
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, response: dict, history: list[dict]) -> None:
        self._items[response["id"]] = (response, history)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)  # the oldest goes first

    def get(self, rid: str) -> tuple[dict, list[dict]] | None:
        return self._items.get(rid)


def _assistant_message(msg: ChatMessage) -> dict[str, Any]:
    """The output as a chat history message, for a later previous_response_id."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    if msg.tool_calls:
        out["tool_calls"] = [tc.model_dump() for tc in msg.tool_calls]
    return out


def _items(msg: ChatMessage, ids: dict[str, str]) -> list[dict[str, Any]]:
    """Output items of a finished message; `ids` keeps the item ids a stream already announced."""
    items: list[dict[str, Any]] = []
    if msg.reasoning_content:
        items.append({"type": "reasoning", "id": ids.get("reasoning") or random_id("rs_"), "summary": [],
                      "content": [{"type": "reasoning_text", "text": msg.reasoning_content}],
                      "status": "completed"})  # fmt: skip
    if msg.content:
        items.append({"type": "message", "id": ids.get("message") or random_id("msg_"), "role": "assistant",
                      "status": "completed",
                      "content": [{"type": "output_text", "text": msg.content, "annotations": [], "logprobs": []}]})  # fmt: skip
    for tc in msg.tool_calls or []:
        items.append({"type": "function_call", "id": ids.get(tc.id) or random_id("fc_"), "call_id": tc.id,
                      "name": tc.function.name, "arguments": tc.function.arguments, "status": "completed"})  # fmt: skip
    return items


def _response(req: ResponsesRequest, tm: TokenizerManager, rid: str, status: str, output: list, usage=None,
              reason: dict | None = None) -> dict[str, Any]:  # fmt: skip
    incomplete = status == "incomplete"
    return {
        "id": rid, "object": "response", "created_at": now(), "status": status, "model": tm.model_name,
        "output": output, "usage": usage, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id, "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": req.temperature, "top_p": req.top_p, "store": req.store, "metadata": req.metadata or {},
        "tool_choice": req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else (req.tool_choice or "auto"),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "reasoning": req.reasoning.model_dump() if req.reasoning else None,
        "text": {"format": {"type": "text"}} if req.text is None else req.text.model_dump(by_alias=True, exclude_none=True),
        "truncation": "disabled",
    }  # fmt: skip


def _usage(tm: TokenizerManager, choices, reasoning: str | None) -> dict[str, Any]:
    u = usage_of(choices, 1, True)
    think = len(tm.tokenizer.encode(reasoning)) if reasoning else 0
    return {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens, "total_tokens": u.total_tokens,
            "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
            "output_tokens_details": {"reasoning_tokens": think}}  # fmt: skip


async def serve_responses(tm: TokenizerManager, req: ResponsesRequest, raw_request: Any, store: ResponseStore):
    if (err := check_model(tm, req.model)) is not None:
        return err
    history: list[dict] = []
    if req.previous_response_id is not None:
        found = store.get(req.previous_response_id)
        if found is None:
            return error_response(f"previous response {req.previous_response_id!r} not found (responses are kept "
                                  f"in this server's memory, the last {store.capacity})", 400,
                                  param="previous_response_id")  # fmt: skip
        history = list(found[1])
    try:
        turn = input_messages(req.input)
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        chat = ChatCompletionRequest.model_validate(chat_fields(req, system + history + turn), strict=False)
        setup, choices = _build(tm, chat)
    except ValidationError as e:
        message, param = validation_message(e)
        return error_response(message, 400, param=param)
    except (ChatRequestError, MediaError) as e:
        return error_response(str(e), 400, param="input")
    except GrammarError as e:
        return error_response(str(e), 400)
    rid = random_id("resp_")

    def finish(msg: ChatMessage, finish_reason: str | None, ids: dict[str, str]) -> dict[str, Any]:
        status = "incomplete" if finish_reason == "length" else "completed"
        body = _response(req, tm, rid, status, _items(msg, ids), _usage(tm, choices, msg.reasoning_content))
        if req.store:
            store.put(body, history + turn + [_assistant_message(msg)])
        return body

    if req.stream:
        await prime_streams(tm, choices, raw_request)
        events = _events(tm, req, chat, setup, choices, rid, finish)
        return ClosingStreamingResponse(events, media_type="text/event-stream")
    await run_to_completion(tm, choices, raw_request)
    final = _final_choice(tm, chat, setup, choices[0])
    return JSONResponse(finish(final.message, final.finish_reason, {}))


async def _events(tm, req, chat, setup, choices, rid, finish) -> AsyncIterator[str]:
    """Responses streaming events from the chat chunks of the one choice."""
    w = EventWriter()
    state = _StreamState(parser=setup.parser(tm))
    yield w.emit("response.created", response=_response(req, tm, rid, "in_progress", []))
    yield w.emit("response.in_progress", response=_response(req, tm, rid, "in_progress", []))
    merged = merge_streams(tm, choices)
    try:
        async for c, out in merged:
            failed = take_output(c, out)
            if failed is not None:
                yield failed
                return
            for part in _step(tm, chat, c, state, out):
                for event in w.delta(part):
                    yield event
        final = _final_choice(tm, chat, setup, choices[0])
        for tc, call_id in zip(final.message.tool_calls or [], w.call_ids):
            tc.id = call_id  # the parse of the whole output names its calls anew; keep the streamed ids
        for event in w.close_all():
            yield event
        body = finish(final.message, final.finish_reason, w.ids)
        yield w.emit("response.incomplete" if body["status"] == "incomplete" else "response.completed", response=body)
    finally:
        await merged.aclose()


def build_responses_routes(router, handle) -> None:
    """Mount POST /v1/responses and GET /v1/responses/{id} on the OpenAI router."""
    store = ResponseStore()

    @router.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await handle(request, ResponsesRequest, lambda tm, req, raw: serve_responses(tm, req, raw, store))

    @router.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> Response:
        found = store.get(response_id)
        if found is None:
            return error_response(f"response {response_id!r} not found", 404, param="response_id")
        return JSONResponse(found[0])
