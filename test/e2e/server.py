"""Start real `python -m sglang.launch_server` processes for end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *flags: str, timeout: float = 240.0, api_key: str | None = None, env: dict | None = None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        cmd += list(flags)
        if api_key:
            cmd += ["--api-key", api_key]
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._wait_ready(timeout)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.proc.stdout.read()}")
            try:
                if requests.get(self.base_url + "/health_generate", headers=self.headers, timeout=30).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError("server did not become ready")

    def post(self, path: str, json=None, **kw) -> requests.Response:
        return requests.post(self.base_url + path, json=json, headers=self.headers, timeout=300, **kw)

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.base_url + path, headers=self.headers, timeout=60, **kw)

    def generate(self, **body) -> dict:
        r = self.post("/generate", body)
        assert r.status_code == 200, r.text
        return r.json()

    def internal_state(self) -> dict:
        return self.get("/get_server_info").json()["internal_states"][0]

    def wait_idle_baseline(self, timeout: float = 30.0) -> dict:
        """Wait until no request runs; then no slot may be unaccounted for (free or held by the
        prefix cache), and after /flush_cache every pool must be back to full."""
        deadline = time.time() + timeout
        while True:
            st = self.internal_state()
            if st["num_running_reqs"] == 0 and st["num_waiting_reqs"] == 0:
                break
            if time.time() > deadline:
                raise AssertionError(f"requests still running: {st}")
            time.sleep(0.2)
        cached = st.get("radix_cached_tokens", 0)
        assert st["full_kv_available"] + cached == st["full_kv_total"], f"full KV slots leaked: {st}"
        assert st["swa_kv_available"] + st.get("radix_swa_tokens", 0) == st["swa_kv_total"], (
            f"swa leaked: {st}"
        )
        assert st["req_slots_available"] == st["req_slots_total"], f"request slots leaked: {st}"
        if "sconv_checkpoints_total" in st:
            assert (
                st["sconv_checkpoints_available"] + st["radix_checkpoints"] == st["sconv_checkpoints_total"]
            )
        assert self.post("/flush_cache").status_code == 200
        flushed = self.internal_state()
        for kind in ("full_kv", "swa_kv", "req_slots"):
            assert flushed[f"{kind}_available"] == flushed[f"{kind}_total"], (
                f"{kind} not free after flush: {flushed}"
            )
        return st

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
