"""A long greedy request kept in flight while a test sends something bad: it must finish unharmed,
with exactly the tokens the same request gets when it runs alone."""

from __future__ import annotations

import threading
import time

import requests

from test.unit.helpers import random_prompt

TOKENS = 48


def body(seed: int, n: int = TOKENS) -> dict:
    sp = {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}
    return {"input_ids": random_prompt(24, seed=seed), "sampling_params": sp}


def reference(server, seed: int) -> list[int]:
    """The request's output alone on the server (cached per server: greedy is deterministic)."""
    refs = server.__dict__.setdefault("_bystander_refs", {})
    if seed not in refs:
        refs[seed] = server.generate(**body(seed))["output_ids"]
    return refs[seed]


class Bystander:
    def __init__(self, server, seed: int = 11):
        self.server, self.seed = server, seed
        self.expected = reference(server, seed)
        self.result: dict = {}

    def _run(self) -> None:
        r = requests.post(self.server.base_url + "/generate", json=body(self.seed), headers=self.server.headers,
                          timeout=300)  # fmt: skip
        self.result["status"], self.result["json"] = r.status_code, r.json()

    def __enter__(self) -> Bystander:
        before = self.server.internal_state()["num_finished_reqs"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while time.time() < deadline:  # in flight: admitted and decoding
            st = self.server.internal_state()
            if st["num_running_reqs"] > 0 or st["num_finished_reqs"] > before:
                break
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the bystander request hangs"
        if exc[0] is not None:
            return
        assert self.result["status"] == 200, self.result
        out = self.result["json"]
        assert out["meta_info"]["finish_reason"]["type"] == "length", out["meta_info"]
        assert out["output_ids"] == self.expected, "the bystander's tokens changed"
