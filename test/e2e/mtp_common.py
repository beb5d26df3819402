"""What the MTP e2e files share: servers of the draftable checkpoint (the `draftable` fixture is in
conftest.py), concurrent requests, and the JSON-schema check (speculative output equals the
reference's and is valid)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema

from test.unit.helpers import random_prompt

from .server import ServerProcess

SCHEMA = {
    "type": "object",
    "properties": {
        "nm": {"type": "string", "maxLength": 5},
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "st": {"enum": ["on", "off"]},
    },
    "required": ["nm", "id", "st"],
    "additionalProperties": False,
}


def draftable_server(path: str, *flags: str) -> ServerProcess:
    return ServerProcess("--skip-server-warmup", "--model-path", path, "--chunked-prefill-size", "64", *flags)


def run(server, reqs: list[dict]) -> list[dict]:
    """The requests at once (one batch on the server), results in order."""
    with ThreadPoolExecutor(len(reqs)) as pool:
        return list(pool.map(lambda b: server.generate(**b), reqs))


def check_schema_requests(ref, server, n: int, prompt_len: int, seed: int, new_tokens: int) -> None:
    """n greedy SCHEMA-constrained requests: the same tokens as `ref`, finished by the grammar, valid."""
    reqs = [
        {"input_ids": random_prompt(prompt_len + (prompt_len - 1) * i, seed=seed + i),
         "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "json_schema": json.dumps(SCHEMA)}}
        for i in range(n)
    ]  # fmt: skip
    want = run(ref, reqs)
    got = run(server, reqs)
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    for g in got:
        assert g["meta_info"]["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(g["text"]), SCHEMA)
