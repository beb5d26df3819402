"""Where a serving run's host CPU goes, over time: run beside bench_serving (--launch-server) on the
GPU machine; every --interval seconds it samples each thread of the server's processes (and the
machine's busy cores) and pairs them with the scheduler log's latest `device wait`. When that share
first falls below --low (the host, not the device, sets the step time), it takes a py-spy dump and
a short py-spy record of the scheduler and the HTTP process (when py-spy is on PATH).

    python benchmark/serving_cpu_probe.py --log SERVER.log --out probe.json [--seconds 120]

The JSON's `timeline` rows: time, device wait, machine busy cores, and per process the busiest
threads' CPU share (1.0 = one core) over the last interval.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
NAMES = ("sgl-sched-tp0", "sgl-detokenizer")
WAIT = re.compile(r"device wait: ([0-9.]+)")


def server_pids(parent: int | None = None) -> dict[str, int]:
    """The scheduler and detokenizer by their process names (children of `parent` only, if given);
    the HTTP process as their parent."""
    found: dict[str, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            ppid = int((d / "stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if comm in NAMES and parent in (None, ppid):
            found[comm] = int(d.name)
            found["http"] = ppid
    return found


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of `pid`, keyed 'comm/tid'."""
    out = {}
    for t in Path(f"/proc/{pid}/task").glob("*"):
        try:
            comm, rest = (t / "stat").read_text().split(" (", 1)[1].rsplit(") ", 1)
        except (OSError, ValueError, IndexError):
            continue
        f = rest.split()
        out[f"{comm}/{t.name}"] = (int(f[11]) + int(f[12])) / TICK
    return out


def busy_cores() -> tuple[float, float]:
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return sum(f) / TICK, idle / TICK


def last_wait(log: Path) -> float | None:
    try:
        text = log.read_text(errors="replace")[-20000:]
    except OSError:
        return None
    hits = WAIT.findall(text)
    return float(hits[-1]) if hits else None


def py_spy(pid: int, tag: str, out_dir: Path) -> dict:
    exe = shutil.which("py-spy")
    if exe is None:
        return {}
    res = {}
    dump = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    res["dump"] = (dump.stdout + dump.stderr)[-6000:]
    path = out_dir / f"pyspy_{tag}.txt"
    subprocess.run([exe, "record", "--pid", str(pid), "--duration", "3", "--rate", "250", "--format", "raw",
                    "--output", str(path), "--nonblocking"], capture_output=True, timeout=60)
    if path.exists():  # raw: 'frame;frame;... count' per stack: keep the heaviest
        rows = [ln.rsplit(" ", 1) for ln in path.read_text().splitlines() if ln.strip()]
        rows = sorted(((int(n), s) for s, n in rows), reverse=True)
        total = sum(n for n, _ in rows) or 1
        res["top_stacks"] = [{"share": round(n / total, 3), "stack": s.split(";")[-8:]} for n, s in rows[:25]]
        leaf: dict[str, int] = {}
        for n, s in rows:
            fr = s.split(";")[-1]
            leaf[fr] = leaf.get(fr, 0) + n
        res["top_leaves"] = sorted(((round(n / total, 3), f) for f, n in leaf.items()), reverse=True)[:25]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, required=True, help="the server's log (its decode lines)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--low", type=float, default=0.3, help="device wait under which to profile")
    args = ap.parse_args()
    end = time.time() + args.seconds
    pids: dict[str, int] = {}
    while time.time() < end and len(pids) < 3:
        pids = server_pids()
        time.sleep(0.5)
    result: dict = {"pids": pids, "timeline": [], "profiles": {}}
    prev = {k: thread_cpu(p) for k, p in pids.items()}
    prev_cores, t_prev = busy_cores(), time.time()
    profiled = high = False
    while time.time() < end and pids and Path(f"/proc/{pids['sgl-sched-tp0']}").exists():
        time.sleep(args.interval)
        now, cores = time.time(), busy_cores()
        dt = now - t_prev
        row: dict = {"t": round(now, 2), "device_wait": last_wait(args.log),
                     "busy_cores": round(((cores[0] - prev_cores[0]) - (cores[1] - prev_cores[1])) / dt, 2)}
        for k, p in pids.items():
            cur = thread_cpu(p)
            use = {n: round((s - prev[k].get(n, 0.0)) / dt, 2) for n, s in cur.items()}
            row[k] = {"total": round(sum(use.values()), 2),
                      "threads": dict(sorted(((n, u) for n, u in use.items() if u >= 0.05), key=lambda x: -x[1])[:8])}
            prev[k] = cur
        prev_cores, t_prev = cores, now
        result["timeline"].append(row)
        w = row["device_wait"]
        high = high or (w is not None and w > 0.5)
        if not profiled and high and w is not None and w < args.low:
            profiled = True
            for k in ("sgl-sched-tp0", "http"):
                result["profiles"][k] = py_spy(pids[k], k, args.out.parent)
        args.out.write_text(json.dumps(result, indent=1))
    if not profiled:  # never went host-bound: nothing was profiled
        result["profiles"]["note"] = "device wait never fell below --low"
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
