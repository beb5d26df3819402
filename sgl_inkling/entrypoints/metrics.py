"""Prometheus text exposition of the scheduler's and tokenizer manager's counters."""

from __future__ import annotations

_GAUGES = {
    "num_running_reqs": "Requests decoding or prefilling",
    "num_waiting_reqs": "Requests waiting for admission",
    "num_retracted_reqs": "Requests retracted to free KV memory (cumulative)",
    "num_finished_reqs": "Requests finished (cumulative)",
    "full_kv_available": "Free slots in the full-attention KV pool",
    "full_kv_total": "Slots in the full-attention KV pool",
    "swa_kv_available": "Free slots in the sliding-window KV pool",
    "swa_kv_total": "Slots in the sliding-window KV pool",
}


def render_metrics(tm, state: dict) -> str:
    name = tm.model_name
    lines = []
    for key, help_ in _GAUGES.items():
        metric = f"sglang:{key}"
        lines += [
            f"# HELP {metric} {help_}",
            f"# TYPE {metric} gauge",
            f'{metric}{{model_name="{name}"}} {state.get(key, 0)}',
        ]
    used = state.get("full_kv_total", 0) - state.get("full_kv_available", 0)
    usage = used / state["full_kv_total"] if state.get("full_kv_total") else 0.0
    lines += ["# HELP sglang:token_usage Fraction of the full KV pool in use", "# TYPE sglang:token_usage gauge",
              f'sglang:token_usage{{model_name="{name}"}} {usage:.6f}',
              "# HELP sglang:num_requests_total Requests received", "# TYPE sglang:num_requests_total counter",
              f'sglang:num_requests_total{{model_name="{name}"}} {tm.num_requests}']  # fmt: skip
    return "\n".join(lines) + "\n"


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
