"""`Runtime`: start a local `python -m sglang.launch_server` process and use it as a backend."""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import requests

from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_flags(kwargs: dict[str, Any]) -> list[str]:
    """ServerArgs-style keyword arguments -> launch_server flags (`tp_size=2` -> `--tp-size 2`)."""
    argv: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue  # unset, or a store_true flag left off
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


class Runtime:
    """A server process owned by this object; `endpoint` is the backend programs run on."""

    def __init__(
        self,
        log_level: str = "error",
        launch_timeout: float = 300.0,
        *,
        reasoning_effort: float | str | None = None,
        **kwargs: Any,
    ):
        if "model" in kwargs and "model_path" not in kwargs:
            kwargs["model_path"] = kwargs.pop("model")
        host = kwargs.setdefault("host", "127.0.0.1")
        if not kwargs.get("port"):
            kwargs["port"] = free_port(host)
        connect_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        self.url = f"http://{connect_host}:{kwargs['port']}"
        self.api_key: str | None = kwargs.get("api_key")
        cmd = [sys.executable, "-m", "sglang.launch_server", "--log-level", log_level, *server_flags(kwargs)]
        # Output goes to a file, not a pipe: nobody reads a pipe while the server runs, and a full
        # pipe would stall it. The file's tail explains a failed start.
        self._log = tempfile.NamedTemporaryFile("w+", prefix="sglang-runtime-", suffix=".log", delete=False)
        self.process: subprocess.Popen | None = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ)
        )
        self.pid = self.process.pid
        atexit.register(self.shutdown)
        try:
            self._wait_ready(launch_timeout)
        except BaseException:
            self.shutdown()
            raise
        self.endpoint = RuntimeEndpoint(self.url, api_key=self.api_key, reasoning_effort=reasoning_effort)

    def _wait_ready(self, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with code {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                # /health_generate runs a one-token generation: ready means able to serve, not just up.
                if requests.get(self.url + "/health_generate", headers=headers, timeout=30).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the server did not become ready in {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n_chars: int = 4000) -> str:
        with open(self._log.name, errors="replace") as f:
            return f.read()[-n_chars:]

    def shutdown(self) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        self._log.close()
        os.unlink(self._log.name)

    # ------------------------------------------------------------ upstream's convenience methods

    def generate(
        self,
        prompt: str | list[str],
        sampling_params: dict[str, Any] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
    ) -> str:
        """One /generate call; returns the response as JSON text (as upstream's Runtime does)."""
        body: dict[str, Any] = {"text": prompt, "sampling_params": sampling_params or {}}
        body["return_logprob"] = return_logprob
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        if top_logprobs_num is not None:
            body["top_logprobs_num"] = top_logprobs_num
        return json.dumps(self.endpoint.generate(body))

    def get_server_info(self) -> dict[str, Any]:
        return self.endpoint.get_server_info()

    def flush_cache(self) -> None:
        self.endpoint.flush_cache()

    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"Runtime({self.url!r}, pid={self.pid})"
