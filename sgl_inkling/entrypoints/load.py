"""/get_load: what each data-parallel replica is carrying (sglang-router's load balancing reads it)."""

from __future__ import annotations


def replica_loads(state: dict) -> list[dict]:
    """SGLang's /get_load: one entry per data-parallel replica. num_tokens counts KV slots held by
    requests (the prefix cache's evictable slots are free capacity, so they are not load)."""
    out = []
    for rank, s in enumerate(state.get("replicas", [state])):
        held = s.get("full_kv_total", 0) - s.get("full_kv_available", 0) - s.get("radix_cached_tokens", 0)
        out.append({
            "dp_rank": rank,
            "num_reqs": s.get("num_running_reqs", 0) + s.get("num_waiting_reqs", 0),
            "num_waiting_reqs": s.get("num_waiting_reqs", 0),
            "num_tokens": max(held, 0),
        })  # fmt: skip
    return out
