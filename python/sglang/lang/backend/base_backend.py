"""What the interpreter needs from a backend: SGLang's native /generate, plus a few server calls."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class SglServerError(RuntimeError):
    """The server refused or failed a request; carries its HTTP status and message."""

    def __init__(self, status_code: int, message: str):
        super().__init__(f"server answered {status_code}: {message}")
        self.status_code = status_code
        self.message = message


class BaseBackend:
    """A server that speaks SGLang's native API. `body` is a /generate request body."""

    # How chat programs render their "Thinking effort level" message (None: the renderer's default).
    reasoning_effort: float | str | None = None

    def generate(self, body: dict[str, Any]) -> Any:
        raise NotImplementedError

    def generate_stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Cumulative results, one per server chunk, the last one finished."""
        raise NotImplementedError

    def get_model_name(self) -> str:
        raise NotImplementedError

    def get_server_info(self) -> dict[str, Any]:
        raise NotImplementedError

    def flush_cache(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Release what the backend holds (a client holds nothing)."""
