"""The HTTP server: SGLang's native endpoints, the OpenAI API, auth and request-size limits."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from sgl_inkling.entrypoints.load import replica_loads
from sgl_inkling.entrypoints.native_fields import strip_accepted_fields
from sgl_inkling.entrypoints.openai.router import build_openai_router
from sgl_inkling.managers.io_struct import GenerateReqInput, RequestError
from sgl_inkling.managers.metrics_collector import CONTENT_TYPE
from sgl_inkling.managers.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)
_GENERATE_FIELDS = {f.name for f in dataclasses.fields(GenerateReqInput)}
_OPEN_PATHS = {"/health", "/metrics"}


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {"object": "error", "message": message, "type": "BadRequestError" if status < 500 else "InternalError",
         "code": status, "error": {"message": message, "code": status}},
        status_code=status,
    )  # fmt: skip


async def read_json(request: Request) -> dict:
    body = await request.body()
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestError("the request body is not valid UTF-8") from None
    except json.JSONDecodeError as e:
        raise RequestError(f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    return data


class GuardMiddleware:
    """API key and body-size checks as plain ASGI: a BaseHTTPMiddleware would wrap `receive` and hide
    client disconnects from the endpoints, so aborted requests would keep running."""

    def __init__(self, app, api_key: str | None, max_bytes: int):
        self.app, self.api_key, self.max_bytes = app, api_key, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key and scope["path"] not in _OPEN_PATHS:
            if headers.get("authorization", "") != f"Bearer {self.api_key}":
                resp = error(401, "missing or invalid API key (send 'Authorization: Bearer <key>')")
                return await resp(scope, receive, send)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            return await error(413, f"the request body exceeds {self.max_bytes} bytes")(scope, receive, send)
        return await self.app(scope, receive, send)


def create_app(tm: TokenizerManager, backend, server_args) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await tm.start()
        task = asyncio.get_running_loop().create_task(_announce(tm, server_args))
        yield
        task.cancel()
        backend.shutdown()

    app = FastAPI(lifespan=lifespan, title="sglang-inkling")
    app.state.tm = tm
    app.include_router(build_openai_router(lambda: tm))

    app.add_middleware(GuardMiddleware, api_key=server_args.api_key, max_bytes=server_args.max_payload_bytes)

    @app.exception_handler(RequestError)
    async def request_error(_: Request, e: RequestError):
        return error(e.status_code, e.message)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if backend.alive() else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        obj = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0})
        try:
            async for _ in tm.generate_request(obj):
                pass
        except Exception as e:  # noqa: BLE001 - health reports, never raises
            logger.warning("health_generate failed: %s", e)
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def model_info():
        return {
            "model_path": backend.info.get("model_path"),
            "tokenizer_path": server_args.tokenizer_path,
            "served_model_name": tm.model_name,
            "is_generation": True,
            "context_length": tm.context_len,
        }

    @app.get("/get_server_info")
    async def server_info():
        state = await tm.get_internal_state()
        return {
            **dataclasses.asdict(server_args),
            **backend.info,
            "internal_states": [state],
            "version": "0.1.0",
        }

    @app.get("/get_load")
    async def get_load():
        return replica_loads(await tm.get_internal_state())

    # The names newer SGLang releases (and sglang-router, before it falls back) use.
    app.add_api_route("/server_info", server_info, methods=["GET"])
    app.add_api_route("/model_info", model_info, methods=["GET"])

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        resp = await tm.flush_cache()
        return PlainTextResponse("Cache flushed.\n" if resp.success else resp.message, status_code=200)

    @app.post("/abort_request")
    async def abort_request(request: Request):
        data = await read_json(request)
        rid = data.get("rid", "")
        if not isinstance(rid, str):
            raise RequestError("'rid' must be a string")
        tm.abort_request(rid)
        return Response(status_code=200)

    if tm.metrics is not None:  # --enable-metrics; without it /metrics is a 404, as upstream

        @app.get("/metrics")
        async def metrics():
            state = await tm.get_internal_state()
            return Response(tm.metrics.render(state), media_type=CONTENT_TYPE)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        data = strip_accepted_fields(await read_json(request))
        unknown = set(data) - _GENERATE_FIELDS
        if unknown:
            raise RequestError(f"unknown field(s) in /generate body: {sorted(unknown)}")
        obj = GenerateReqInput(**data)
        if obj.stream:
            gen = tm.generate_request(obj, request)
            first = await anext(gen)  # raise validation errors as a 4xx before streaming starts

            async def sse():
                yield b"data: " + orjson.dumps(first) + b"\n\n"
                async for out in gen:
                    yield b"data: " + orjson.dumps(out) + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")
        async for out in tm.generate_request(obj, request):
            return Response(orjson.dumps(out), media_type="application/json")

    return app


async def _announce(tm: TokenizerManager, server_args) -> None:
    """Warm the model up with one short request, then say the server is ready (as SGLang does)."""
    if not server_args.skip_server_warmup:
        obj = GenerateReqInput(text="Hello", sampling_params={"max_new_tokens": 2, "temperature": 0})
        async for _ in tm.generate_request(obj):
            pass
    logger.info(
        "The server is fired up and ready to roll! (http://%s:%d)", server_args.host, server_args.port
    )
