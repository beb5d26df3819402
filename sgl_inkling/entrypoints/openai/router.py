"""The OpenAI-compatible routes, mounted by the HTTP server: /v1/models, /v1/completions,
/v1/chat/completions, /v1/responses.

Bodies are parsed here rather than by FastAPI, so that malformed JSON and wrong types answer 400 in
OpenAI's error shape instead of FastAPI's 422. The engine is reached through `get_tm()` at request
time (the server creates its TokenizerManager after the routes are declared). Its contract:

- `generate_request(obj, request)` is an async generator; it raises `RequestError` before yielding
  for a request it refuses. A streamed single request yields cumulative dicts ("text", "output_ids",
  "meta_info"), the last with `meta_info["finish_reason"]` set; a non-streamed one yields one dict.
- `abort_request(rid)` stops a request; it is called for every unfinished choice when the client
  goes away or another choice of the same request fails.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from sgl_inkling.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from sgl_inkling.entrypoints.openai.serving_base import (
    TokenizerManager,
    check_model,
    error_response,
    validation_message,
)
from sgl_inkling.entrypoints.openai.serving_chat import serve_chat
from sgl_inkling.entrypoints.openai.serving_completions import serve_completions
from sgl_inkling.entrypoints.openai.serving_responses import build_responses_routes
from sgl_inkling.entrypoints.request_schema import request_body
from sgl_inkling.managers.io_struct import RequestError

logger = logging.getLogger(__name__)

Serve = Callable[[TokenizerManager, Any, Request], Awaitable[Response]]
BODY_MODELS = [CompletionRequest, ChatCompletionRequest]  # declared in /openapi.json (request_schema)


def _model_card(tm: TokenizerManager) -> ModelCard:
    return ModelCard(id=tm.model_name, root=tm.model_name, max_model_len=tm.context_len)


def build_openai_router(get_tm: Callable[[], TokenizerManager]) -> APIRouter:
    router = APIRouter()

    async def handle(request: Request, model: type[BaseModel], serve: Serve) -> Response:
        try:
            req = model.model_validate_json(await request.body())
        except ValidationError as e:
            message, param = validation_message(e)
            return error_response(message, 400, param=param)
        try:
            return await serve(get_tm(), req, request)
        except RequestError as e:
            return error_response(e.message, e.status_code)
        except Exception as e:  # a bug, not the client's fault: still answer in OpenAI's shape
            logger.exception("%s failed", request.url.path)
            return error_response(f"internal error: {type(e).__name__}: {e}", 500)

    @router.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse(ModelList(data=[_model_card(get_tm())]).model_dump())

    @router.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> JSONResponse:
        tm = get_tm()
        missing = check_model(tm, model_id)
        return missing if missing is not None else JSONResponse(_model_card(tm).model_dump())

    @router.post("/v1/completions", openapi_extra=request_body(CompletionRequest))
    async def completions(request: Request) -> Response:
        return await handle(request, CompletionRequest, serve_completions)

    @router.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        return await handle(request, ChatCompletionRequest, serve_chat)

    build_responses_routes(router, handle)
    return router
