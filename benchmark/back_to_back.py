"""The back-to-back figure of a serving level (issue 20): what the engine's own step times give if
every prefill and every decode step ran one after another at full batch.

    time = N x prefill(input_len) + sum over waves of output_len x decode_step(wave size)

Requests run in waves of B = min(concurrency, N, max running requests, requests whose whole
input + output fit in the KV pool at once); the last wave holds what is left. Decode step times
come from engine_timings.py at a few batch sizes, linearly interpolated between them (and
extrapolated from the nearest two beyond them; the JSON says so).
"""

from __future__ import annotations


def step_ms(table: dict[str, float], bsz: int) -> tuple[float, bool]:
    """(decode step ms at `bsz`, whether it was measured at exactly that size)."""
    pts = sorted((int(k), v) for k, v in table.items())
    exact = dict(pts)
    if bsz in exact:
        return exact[bsz], True
    if len(pts) == 1:
        return pts[0][1], False
    lo = max([p for p in pts if p[0] < bsz], default=None, key=lambda p: p[0])
    hi = min([p for p in pts if p[0] > bsz], default=None, key=lambda p: p[0])
    if lo is None:
        lo, hi = pts[0], pts[1]
    elif hi is None:
        lo, hi = pts[-2], pts[-1]
    (x0, y0), (x1, y1) = lo, hi
    return y0 + (y1 - y0) * (bsz - x0) / (x1 - x0), False


def back_to_back(engine: dict, concurrency: int, num_prompts: int, input_len: int, output_len: int,
                 server_info: dict) -> dict:  # fmt: skip
    """The figure and how it was made, for one level (lengths as served)."""
    caps = {"concurrency": concurrency, "prompts": num_prompts}
    if server_info.get("max_running_requests"):
        caps["max_running_requests"] = int(server_info["max_running_requests"])
    if server_info.get("max_total_num_tokens"):
        caps["fit_in_kv"] = max(1, int(server_info["max_total_num_tokens"]) // (input_len + output_len))
    wave = min(caps.values())
    sizes = [wave] * (num_prompts // wave) + ([num_prompts % wave] if num_prompts % wave else [])
    prefill_ms = float(engine["prefill_ms"]) * input_len / int(engine["input_len"])
    decode_ms, exact = 0.0, True
    for b in sizes:
        ms, hit = step_ms(engine["decode_step_ms"], b)
        decode_ms += output_len * ms
        exact &= hit
    total_s = (num_prompts * prefill_ms + decode_ms) / 1e3
    return {
        "output_throughput": num_prompts * output_len / total_s,
        "duration_s": total_s,
        "prefill_all_s": num_prompts * prefill_ms / 1e3,
        "prefill_ms": prefill_ms,
        "wave_size": wave,
        "waves": len(sizes),
        "wave_limited_by": sorted(k for k, v in caps.items() if v == wave),
        "decode_step_ms": step_ms(engine["decode_step_ms"], wave)[0],
        "decode_steps_measured_at_wave_sizes": exact,
        "engine_timings": {k: engine.get(k) for k in ("timestamp", "git_commit", "input_len", "decode_context_len")},
        "input_len_scaled": input_len != int(engine["input_len"]),
    }
