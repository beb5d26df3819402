"""The HTTP server: SGLang's native endpoints, the OpenAI API, auth and request-size limits."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr, ValidationError

from sgl_inkling.entrypoints.gc_control import freeze_after_startup, warn_long_collections
from sgl_inkling.entrypoints.guard import GuardMiddleware
from sgl_inkling.entrypoints.load import replica_loads
from sgl_inkling.entrypoints.native_output import engine_error, sse_events
from sgl_inkling.entrypoints.native_protocol import GenerateRequest
from sgl_inkling.entrypoints.openai.router import BODY_MODELS, build_openai_router
from sgl_inkling.entrypoints.request_schema import declare_request_bodies, request_body, validation_text
from sgl_inkling.managers.io_struct import GenerateReqInput, RequestError
from sgl_inkling.managers.metrics_collector import CONTENT_TYPE
from sgl_inkling.managers.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)


class AbortRequestBody(BaseModel):
    """/abort_request: one request by rid, or every request with abort_all (upstream's fields)."""

    model_config = ConfigDict(extra="forbid")
    rid: StrictStr = ""
    abort_all: StrictBool = False


def error_body(status: int, message: str) -> dict:
    return {"object": "error", "message": message, "type": "BadRequestError" if status < 500 else "InternalError",
            "code": status, "error": {"message": message, "code": status}}  # fmt: skip


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


async def read_json(request: Request) -> dict:
    """The body as a JSON object. orjson refuses what would fail later with a 500: nesting deeper
    than 1024 (no recursion), lone surrogates (not encodable text), invalid UTF-8, NaN."""
    try:
        data = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise RequestError(f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    return data


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

    declare_request_bodies(app, [*BODY_MODELS, AbortRequestBody, GenerateRequest])
    app.add_middleware(
        GuardMiddleware, api_key=server_args.api_key, max_bytes=server_args.max_payload_bytes, error=error
    )

    @app.exception_handler(RequestError)
    async def request_error(_: Request, e: RequestError):
        return error(e.status_code, e.message)

    @app.get("/health", response_class=Response)
    async def health() -> Response:
        if not backend.alive():
            return error(503, "a server process has exited")
        if tm.draining:
            return error(503, "the server is shutting down")
        if tm.model_fault is not None:
            return error(503, f"unhealthy since a model step failed: {tm.model_fault}")
        return Response(status_code=200)

    faults_seen = [0]  # model-step failures already reported by /health_generate

    @app.get("/health_generate", response_class=Response)
    async def health_generate() -> Response:
        """Generate one token. 503 when that fails, or (once) when a model step failed since the
        previous probe; a successful probe clears /health's 503."""
        fault, new_faults = tm.model_fault, tm.num_model_faults != faults_seen[0]
        before = tm.num_model_faults
        obj = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0})
        try:
            async for out in tm.generate_request(obj):
                if engine_error(out) is not None:
                    raise engine_error(out)
        except Exception as e:  # noqa: BLE001 - health reports, never raises
            logger.warning("health_generate failed: %s", e)
            faults_seen[0] = tm.num_model_faults  # reported now
            return error(503, f"generation failed: {e}")
        if tm.num_model_faults == before:
            tm.model_fault = None  # nothing failed while this probe ran: generation works again
        faults_seen[0] = tm.num_model_faults
        if new_faults:
            return error(503, f"a model step failed since the last probe: {fault}")
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def model_info():
        return {
            "model_path": backend.info.get("model_path"),
            "tokenizer_path": backend.info.get("tokenizer_path", server_args.tokenizer_path),
            "served_model_name": tm.model_name,
            "is_generation": True,
            "context_length": tm.context_len,
        }

    @app.get("/get_server_info")
    async def server_info():
        state = await tm.get_internal_state()
        args = {k: v for k, v in dataclasses.asdict(server_args).items() if not k.endswith("api_key")}
        return {
            **args,  # never the API key
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

    @app.post("/abort_request", response_class=Response, openapi_extra=request_body(AbortRequestBody))
    async def abort_request(request: Request):
        try:
            body = AbortRequestBody.model_validate(await read_json(request))
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            raise RequestError(f"/abort_request: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        tm.abort_request(body.rid, abort_all=body.abort_all)  # an unknown or empty rid: no-op (200, as upstream)
        return Response(status_code=200)

    if tm.metrics is not None:  # --enable-metrics; without it /metrics is a 404, as upstream

        @app.get("/metrics")
        async def metrics():
            state = await tm.get_internal_state()
            return Response(tm.metrics.render(state), media_type=CONTENT_TYPE)

    @app.api_route("/generate", methods=["POST", "PUT"], openapi_extra=request_body(GenerateRequest))
    async def generate(request: Request):
        try:
            obj = GenerateRequest.model_validate(await read_json(request)).to_input()
        except ValidationError as e:
            raise RequestError(validation_text(e)) from None
        if obj.stream:
            gen = tm.generate_request(obj, request, incremental=server_args.incremental_streaming_output)
            first = await anext(gen)  # raise validation errors as a 4xx before streaming starts
            refused = engine_error(first)  # refused by the scheduler before any token
            if refused is not None:
                raise refused
            return StreamingResponse(sse_events(first, gen, error_body), media_type="text/event-stream")
        async for out in tm.generate_request(obj, request):
            failed = engine_error(out)
            if failed is not None:
                raise failed
            return Response(orjson.dumps(out), media_type="application/json")

    return app


async def _announce(tm: TokenizerManager, server_args) -> None:
    """Warm the model up with one short request, then say the server is ready (as SGLang does)."""
    if not server_args.skip_server_warmup:
        obj = GenerateReqInput(text="Hello", sampling_params={"max_new_tokens": 2, "temperature": 0})
        async for _ in tm.generate_request(obj):
            pass
    warn_long_collections(server_args.gc_warning_threshold_secs, "tokenizer manager")
    freeze_after_startup("tokenizer manager")  # the HTTP process: its pauses delay every stream too
    logger.info(
        "The server is fired up and ready to roll! (http://%s:%d)", server_args.host, server_args.port
    )
