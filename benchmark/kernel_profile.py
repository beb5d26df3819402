"""Kernel time per step from a torch.profiler run, for the profile_* scripts: the table they print
and the JSON they write."""

from __future__ import annotations

import collections
import json
from pathlib import Path


def kernel_rows(prof, steps: int) -> list[dict]:
    """CUDA kernels by total time, per step: name, calls_per_step, us_per_step."""
    per = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name][0] += 1
            per[e.name][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])
    return [{"name": n, "calls_per_step": c / steps, "us_per_step": u / steps} for n, (c, u) in rows]


def source_rows(prof, steps: int, roots: tuple[str, ...] = ("sgl_inkling/", "kernels/")) -> list[dict]:
    """CUDA kernels grouped by the project line that launched them (the profile needs
    with_stack=True), per step: where, launches_per_step, us_per_step, kernels. What fusing a line's
    small ops would save is its launches (about 2 us each in a graph) more than its kernel time.
    Launches outside a torch op (Triton's) have no stack: they are grouped by kernel name."""
    per = collections.defaultdict(lambda: [0, 0.0, set()])
    for e in prof.events():
        if e.device_type.name != "CPU" or not e.kernels:
            continue
        where = _launching_line(e, roots)
        for k in e.kernels:
            row = per[where or f"(no stack) {k.name[:60]}"]
            row[0] += 1
            row[1] += k.duration
            row[2].add(k.name[:60])
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])
    return [
        {"where": w, "launches_per_step": c / steps, "us_per_step": u / steps, "kernels": sorted(names)}
        for w, (c, u, names) in rows
    ]


def _launching_line(event, roots: tuple[str, ...]) -> str | None:
    """The innermost project frame enclosing a launch: from the op's recorded stack, or (as recent
    torch records it) from the Python-function events ("file.py(line): name") that enclose it."""
    while event is not None:
        for frame in [*(event.stack or []), event.name]:
            if any(r in frame for r in roots) and "): " in frame:
                return frame[frame.index(next(r for r in roots if r in frame)) :]
        event = event.cpu_parent
    return None


def report(title: str, rows: list[dict], out: Path | None, meta: dict, top: int = 25) -> float:
    """Print the title with the kernel time per step, then the top kernels; write JSON (meta, the
    total and every kernel) to `out` if given. Returns the total in ms."""
    total = sum(r["us_per_step"] for r in rows) / 1e3
    print(f"{title}: kernel time {total:.3f} ms per step")
    print(f"{'us/step':>9} {'calls/step':>10}  kernel")
    for r in rows[:top]:
        print(f"{r['us_per_step']:>9.1f} {r['calls_per_step']:>10.1f}  {r['name'][:110]}")
    if out:
        out.write_text(json.dumps({**meta, "kernel_ms_per_step": total, "kernels": rows}, indent=2))
    return total
