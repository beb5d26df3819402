"""`RuntimeEndpoint`: a running SGLang-compatible server, reached over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import requests

from sglang.lang.backend.base_backend import BaseBackend, SglServerError

# Connecting should be quick; a generation may legitimately run for a long time.
CONNECT_TIMEOUT_S = 30.0


class RuntimeEndpoint(BaseBackend):
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: str | bool | None = None,
        chat_template_name: str | None = None,
        *,
        reasoning_effort: float | str | None = None,
        read_timeout: float | None = None,
    ):
        # chat_template_name is accepted for upstream compatibility: Inkling has one chat format
        # (TMLv0), rendered by tml-renderers, so there is no template to choose.
        del chat_template_name
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self.reasoning_effort = reasoning_effort
        self._timeout = (CONNECT_TIMEOUT_S, read_timeout)
        # requests.Session is not documented as thread-safe; programs run on many threads.
        self._local = threading.local()

    # ---------------------------------------------------------------- HTTP

    @property
    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            if self.api_key:
                session.headers["Authorization"] = f"Bearer {self.api_key}"
        return session

    def _request(self, method: str, path: str, body: Any = None, stream: bool = False) -> requests.Response:
        kw: dict[str, Any] = {"timeout": self._timeout, "stream": stream}
        if self.verify is not None:
            kw["verify"] = self.verify
        resp = self._session.request(method, self.base_url + path, json=body, **kw)
        if resp.status_code >= 400:
            raise SglServerError(resp.status_code, _error_message(resp))
        return resp

    # ---------------------------------------------------------------- generation

    def generate(self, body: dict[str, Any]) -> Any:
        return self._request("POST", "/generate", {**body, "stream": False}).json()

    def generate_stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        resp = self._request("POST", "/generate", {**body, "stream": True}, stream=True)
        with resp:
            for line in resp.iter_lines(decode_unicode=False):
                if not line.startswith(b"data:"):
                    continue  # SSE blank separators and comments
                payload = line[len(b"data:") :].strip()
                if payload == b"[DONE]":
                    return
                chunk = json.loads(payload)
                if "error" in chunk and "text" not in chunk:
                    raise SglServerError(500, str(chunk["error"]))
                yield chunk

    # ---------------------------------------------------------------- server calls

    def get_model_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_model_info").json()

    def get_model_name(self) -> str:
        info = self.get_model_info()
        return info.get("served_model_name") or info.get("model_path") or ""

    def get_server_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_server_info").json()

    def flush_cache(self) -> None:
        self._request("POST", "/flush_cache")

    def cache_prefix(self, prefix_str: str) -> None:
        """Run the prefix once so later programs that share it hit the prefix cache."""
        self.generate({"text": prefix_str, "sampling_params": {"max_new_tokens": 0}})

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.base_url!r})"


def _error_message(resp: requests.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return resp.text.strip()
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if data.get("message"):
            return str(data["message"])
    return resp.text.strip()


def __getattr__(name: str):
    # Upstream exports Runtime from this module too; imported lazily to avoid a cycle.
    if name == "Runtime":
        from sglang.lang.backend.runtime import Runtime

        return Runtime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
