"""How /generate answers a request the engine finished with an error (a status-coded abort).

Before any output: the HTTP status and message (a 4xx for input the scheduler refused, a 5xx when
the step it was in failed). After a stream has started: an SSE error event, then `[DONE]`, so a
client always sees how its stream ended.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import orjson

from sgl_inkling.managers.io_struct import RequestError

logger = logging.getLogger(__name__)

SSE_DONE = b"data: [DONE]\n\n"


def engine_error(out) -> RequestError | None:
    """The error an output (or a batch's list of outputs) finished with, if any."""
    for one in out if isinstance(out, list) else [out]:
        reason = (one.get("meta_info") or {}).get("finish_reason") if isinstance(one, dict) else None
        status = reason.get("status_code") if isinstance(reason, dict) and reason.get("type") == "abort" else None
        if isinstance(status, int) and 400 <= status < 600:
            return RequestError(str(reason.get("message") or "request failed"), status)
    return None


def sse(payload) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def sse_events(first, rest: AsyncIterator, error_body: Callable[[int, str], dict]) -> AsyncIterator[bytes]:
    """The event stream of one request: every output, and for a failure an error event; always [DONE]."""
    try:
        out = first
        while True:
            err = engine_error(out)
            if err is not None:
                yield sse({"error": error_body(err.status_code, err.message)})
                break
            yield sse(out)
            try:
                out = await anext(rest)
            except StopAsyncIteration:
                break
    except RequestError as e:
        yield sse({"error": error_body(e.status_code, e.message)})
    except Exception as e:  # noqa: BLE001 - the stream must end with an event saying why
        logger.exception("stream failed")
        yield sse({"error": error_body(500, f"internal error: {type(e).__name__}: {e}")})
    yield SSE_DONE
