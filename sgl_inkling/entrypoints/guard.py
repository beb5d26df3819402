"""The HTTP server's gate: API key and request-body size, as plain ASGI middleware.

A BaseHTTPMiddleware would wrap `receive` and hide client disconnects from the endpoints, so aborted
requests would keep running; this one reads the body itself, counting bytes as they arrive (chunked
bodies have no Content-Length to trust), answers 413 the moment the limit is passed, and hands the
endpoint the buffered body followed by the real `receive` (which then reports disconnects).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

OPEN_PATHS = {"/health", "/metrics"}


class GuardMiddleware:
    def __init__(self, app, api_key: str | None, max_bytes: int, error: Callable):
        self.app, self.max_bytes, self.error = app, max_bytes, error
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.expected is not None and scope["path"] not in OPEN_PATHS:
            # Constant time: the comparison must not reveal how much of a guessed key was right.
            if not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
                resp = self.error(401, "missing or invalid API key (send 'Authorization: Bearer <key>')")
                return await resp(scope, receive, send)
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        body, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away before sending it all
                return await self.app(scope, _replay([msg], receive), send)
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._too_large(scope, receive, send)
            body.append(chunk)
            if not msg.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(body), "more_body": False}
        return await self.app(scope, _replay([whole], receive), send)

    async def _too_large(self, scope, receive, send):
        resp = self.error(413, f"the request body exceeds {self.max_bytes} bytes (--max-payload-bytes)")
        resp.headers["connection"] = "close"  # the rest of the body is never read
        return await resp(scope, receive, send)


def _replay(messages: list[dict], receive):
    async def replayed() -> dict:
        return messages.pop(0) if messages else await receive()

    return replayed
