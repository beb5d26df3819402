"""Online serving benchmark through the HTTP server: TTFT, TPOT, ITL and throughput per concurrency.

    # against a running server
    python benchmark/bench_serving.py --port 30000 --max-concurrency 1 8 64 256
    # launching one (everything after `--` goes to `python -m sglang.launch_server`)
    python benchmark/bench_serving.py --launch-server --num-prompts 16 -- --model-path inkling-slice \
        --load-format dummy

Prompts are seeded random token ids sent as `input_ids` to /generate with `ignore_eos`, greedy, and
streamed, so every output token's arrival time is seen: TTFT = first token, ITL = gaps between
chunks, TPOT = (E2E - TTFT) / (output tokens - 1). For each `--max-concurrency` level,
`--num-prompts` requests (default: twice the level, at least 8) are kept in flight by that many
client threads (request rate: as fast as the server answers), spread over `--client-processes`
processes so the client keeps up with the server. Flag names follow SGLang's
bench_serving where it has one. Only the standard library (+ numpy, orjson if present) is used on the
client side, so it runs anywhere the server does. Writes one JSON file under benchmark/results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import multiprocessing
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # the serving stack ships orjson; plain json is a slower fallback
    _loads = json.loads

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from benchmark.back_to_back import back_to_back  # noqa: E402
from benchmark.bench_one_batch import git_commit  # noqa: E402
from benchmark.slice_dir import resolve_bench_model  # noqa: E402

# Token ids below this are ordinary BPE tokens of the Inkling vocabulary (specials sit above it).
RANDOM_VOCAB = 199_998


def parse_base(url: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or 80


def request_json(base: str, method: str, path: str, body: dict | None = None, timeout: float = 60.0):
    host, port = parse_base(base)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, data
    finally:
        conn.close()


def _completion_tokens(event: bytes) -> int:
    """meta_info's completion_tokens without parsing the event: streamed /generate events carry the
    whole text and output ids so far (as upstream), so a full parse per event costs the client
    O(output length) and, at concurrency 64, most of a core. A quoted key cannot occur unescaped
    inside a JSON string, so its last occurrence is meta_info's."""
    at = event.rindex(b'"completion_tokens":') + len(b'"completion_tokens":')
    end = at
    while event[end : end + 1].isdigit():
        end += 1
    return int(event[at:end])


def stream_generate(base: str, input_ids: list[int], output_len: int, timeout: float) -> dict:
    """One streamed /generate; returns its timings (seconds since its send) and token counts."""
    host, port = parse_base(base)
    body = {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0.0},
        "stream": True,
    }
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    out = {"prompt_len": len(input_ids), "output_len": 0, "ttft": None, "itl": [], "e2e": None, "error": None,
           "server_e2e": None, "last_token": None}
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/generate", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return out
        last, buf = None, b""
        while True:
            data = resp.read1(1 << 16)  # whatever arrived (chunked framing undone), not line by line
            if not data:
                break
            now = time.perf_counter()
            buf += data
            *events, buf = buf.split(b"\n\n")  # SSE: `data: {...}` events, blank-line separated
            for ev in events:
                ev = ev.strip()
                if not ev.startswith(b"data:") or ev[5:].strip() == b"[DONE]":
                    continue
                n = _completion_tokens(ev)
                if n > out["output_len"]:  # a chunk that only carries the finish reason adds no token
                    if last is None:
                        out["ttft"] = now - t0
                    else:
                        out["itl"].append(now - last)
                    last = now
                    out["last_token"] = now - t0
                    out["output_len"] = n
                if b'"finish_reason":null' not in ev:  # the last event: the server's own e2e (seconds)
                    out["server_e2e"] = _loads(ev[5:])["meta_info"].get("e2e_latency")
        out["e2e"] = time.perf_counter() - t0
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        conn.close()
    return out


def make_prompts(n: int, input_len: int, output_len: int, range_ratio: float, seed: int):
    """(input ids, output length) pairs; lengths drawn from [ratio * len, len] like SGLang's random set."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        i = rng.randint(max(1, int(input_len * range_ratio)), input_len)
        o = rng.randint(max(1, int(output_len * range_ratio)), output_len)
        prompts.append(([rng.randrange(RANDOM_VOCAB) for _ in range(i)], o))
    return prompts


def _client_threads(base: str, jobs, done, n_threads: int, timeout: float) -> None:
    """n_threads threads, each sending the next prompt of `jobs` once its last answer is in, until a
    None; every result goes to `done`. Runs in this process or in a client process."""

    def worker() -> None:
        while (job := jobs.get()) is not None:
            ids, olen = job
            r = stream_generate(base, ids, olen, timeout)
            r["expected_output_len"] = olen
            done.put(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def client_processes(concurrency: int, asked: int | None) -> int:
    """How many processes share the client threads. Streamed /generate events carry the whole output
    so far (as upstream), so one client process at concurrency 64 spends ~150 us per token under one
    GIL: at 6,000 tok/s that is a whole core, and the last tokens reach it ~1 s after the server sent
    them (H200, c751dc6). Default: one process per 4 cores, at most one per request in flight."""
    return max(1, min(concurrency, asked or (os.cpu_count() or 1) // 4))


def run_level(base: str, prompts, concurrency: int, timeout: float, processes: int = 1) -> tuple[list[dict], float]:
    """Keep `concurrency` requests in flight until every prompt has been answered, from `processes`
    client processes (forked; 1: threads of this process)."""
    n_threads = min(concurrency, len(prompts))
    processes = min(processes, n_threads)
    ctx = multiprocessing.get_context("fork") if processes > 1 else None
    jobs, done = (ctx.Queue(), ctx.Queue()) if ctx else (queue.Queue(), queue.Queue())
    for p in prompts:
        jobs.put(p)
    for _ in range(n_threads):
        jobs.put(None)  # one stop per thread, behind every prompt
    t0 = time.perf_counter()
    if ctx is None:
        _client_threads(base, jobs, done, n_threads, timeout)
        results = [done.get() for _ in prompts]
        return results, time.perf_counter() - t0
    share = [n_threads // processes + (i < n_threads % processes) for i in range(processes)]
    procs = [ctx.Process(target=_client_threads, args=(base, jobs, done, k, timeout), daemon=True) for k in share]
    for pr in procs:
        pr.start()
    results: list[dict] = []
    while len(results) < len(prompts):  # drained before the joins: a child exits only once its puts are out
        try:
            results.append(done.get(timeout=1.0))
        except queue.Empty:
            if not any(pr.is_alive() for pr in procs) and done.empty():
                raise RuntimeError(f"client processes exited with {len(results)} of {len(prompts)} answers") from None
    duration = time.perf_counter() - t0
    for pr in procs:
        pr.join()
    return results, duration


ITL_EDGES_MS = (0, 5, 10, 12, 15, 20, 50, 100, 200, 500, float("inf"))


def itl_bins(itls_s: list[float]) -> list[dict]:
    """Inter-token gaps by length: how many, and the time they add up to. Tells a level whose mean
    gap exceeds its median from many slightly slow steps apart from a few long stalls."""
    a = np.asarray(itls_s, dtype=float) * 1e3
    out = []
    for lo, hi in zip(ITL_EDGES_MS, ITL_EDGES_MS[1:]):
        sel = a[(a >= lo) & (a < hi)]
        out.append({"from_ms": lo, "to_ms": hi if hi != float("inf") else None, "count": int(sel.size),
                    "total_s": float(sel.sum() / 1e3)})  # fmt: skip
    return out


def summarize(results: list[dict], duration: float, concurrency: int) -> dict:
    ok = [r for r in results if r["error"] is None and r["ttft"] is not None]
    ms = 1e3

    def stats(name: str, xs: list[float]) -> dict:
        a = np.asarray(xs, dtype=float) * ms if xs else np.asarray([np.nan])
        return {f"mean_{name}_ms": float(a.mean()), f"median_{name}_ms": float(np.median(a)),
                f"std_{name}_ms": float(a.std()), f"p99_{name}_ms": float(np.percentile(a, 99))}  # fmt: skip

    tpots = [(r["e2e"] - r["ttft"]) / (r["output_len"] - 1) for r in ok if r["output_len"] > 1]
    out_tokens = sum(r["output_len"] for r in ok)
    in_tokens = sum(r["prompt_len"] for r in ok)
    return {
        "max_concurrency": concurrency,
        "num_prompts": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r["error"] for r in results if r["error"]})[:5],
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "input_throughput": in_tokens / duration,
        "output_throughput": out_tokens / duration,
        **stats("ttft", [r["ttft"] for r in ok]),
        **stats("tpot", tpots),
        **stats("itl", [x for r in ok for x in r["itl"]]),
        **stats("e2e_latency", [r["e2e"] for r in ok]),
        "itl_bins": itl_bins([x for r in ok for x in r["itl"]]),
        # How long after the server built a request's last output the client had it (the HTTP hop and
        # the client's own lag); large against the TPOT means the figures above are the client's.
        **stats("client_minus_server_e2e", [r["e2e"] - r["server_e2e"] for r in ok if r.get("server_e2e") is not None]),
        # Per request, for checks and later analysis (seconds).
        "requests": [{k: r.get(k) for k in ("prompt_len", "expected_output_len", "output_len", "ttft", "last_token", "e2e",
                                            "server_e2e", "error")}
                     for r in results],  # fmt: skip
    }


class LaunchedServer:
    """`python -m sglang.launch_server` in a child process; its output goes to a log file."""

    def __init__(self, server_args: list[str], host: str, port: int, log: Path, timeout: float):
        self.base = f"http://{host}:{port}"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self._log_file = open(log, "w")  # closed in stop(): lives as long as the server
        cmd = [sys.executable, "-m", "sglang.launch_server", "--host", host, "--port", str(port), *server_args]
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(timeout)
        except BaseException:  # includes the SIGTERM exit: never leave a server holding the GPU
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}; log: {self.log}\n{self.log.read_text()[-3000:]}"
                )
            try:
                if request_json(self.base, "GET", "/health_generate", timeout=30)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"server not ready after {timeout} s; log: {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        return None


def parse_args(argv: list[str] | None):
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args = argv[argv.index("--") + 1:] if "--" in argv else []  # fmt: skip
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=None, help="default: http://HOST:PORT")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--launch-server", action="store_true",
                   help="start a server (arguments after `--`; `--model-path inkling-slice` works) on a free port")
    p.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for a launched server")
    p.add_argument("--dataset-name", choices=("random",), default="random")
    p.add_argument("--num-prompts", type=int, nargs="+", default=None,
                   help="requests per concurrency level: one number for all, or one per --max-concurrency "
                   "(default: 2 x the level, at least 8)")
    p.add_argument("--random-input-len", type=int, default=8192)
    p.add_argument("--random-output-len", type=int, default=1024)
    p.add_argument("--random-range-ratio", type=float, default=1.0,
                   help="lengths drawn from [ratio * len, len]; 1.0: exactly the given lengths")
    p.add_argument("--max-concurrency", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--request-timeout", type=float, default=3600.0)
    p.add_argument("--client-processes", type=int, default=None,
                   help="processes sharing a level's client threads (default: one per 4 cores, at most the level)")
    p.add_argument("--engine-timings", type=Path, default=None,
                   help="engine_timings.py JSON: each level gets its back-to-back figure (back_to_back.py)")
    p.add_argument("--note", default=None, help="free text stored in the JSON (e.g. why lengths were scaled)")
    p.add_argument("--output-file", type=Path, default=None)
    args = p.parse_args(own)
    if args.num_prompts and len(args.num_prompts) not in (1, len(args.max_concurrency)):
        p.error("--num-prompts takes one number or one per --max-concurrency level")
    if args.client_processes is not None and args.client_processes < 1:
        p.error(f"--client-processes must be at least 1, got {args.client_processes}")
    args.server_args = server_args
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    # `timeout` sends SIGTERM: unwind normally so the launched server stops and finished levels are kept.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = None
    server_args = list(args.server_args)
    if args.launch_server:
        server_args, model_name = resolve_bench_model(server_args)
        port = free_port()
        log = (args.output_file or ROOT / "benchmark" / "results" / "bench_serving").with_suffix(".server.log")
        t0 = time.perf_counter()
        server = LaunchedServer(server_args, "127.0.0.1", port, log, args.server_timeout)
        print(f"server ready in {time.perf_counter() - t0:.0f} s ({model_name}); log: {log}", flush=True)
        base = server.base
    else:
        base = args.base_url or f"http://{args.host}:{args.port}"
    try:
        status, data = request_json(base, "GET", "/get_server_info")
        info = _loads(data) if status == 200 else {}
        states = info.pop("internal_states", None) or [{}]
        engine = _loads(args.engine_timings.read_bytes()) if args.engine_timings else None
        commit, dirty = git_commit()
        ts = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        result = {
            "benchmark": "bench_serving",
            "timestamp": ts,
            "git_commit": commit,
            "git_dirty": dirty,
            "gpu": gpu_name(),
            "base_url": base,
            "launched_server": bool(server),
            "server_cmdline_args": server_args if server else None,
            "server_args": info,
            "dataset_name": args.dataset_name,
            "random_input_len": args.random_input_len,
            "random_output_len": args.random_output_len,
            "random_range_ratio": args.random_range_ratio,
            "seed": args.seed,
            "note": args.note,
            "enable_mixed_chunk": info.get("enable_mixed_chunk"),
            "engine_timings": engine,
            "requested_max_concurrency": args.max_concurrency,
            "runs": [],
        }
        model = Path(str(info.get("served_model_name") or "model")).name
        out = args.output_file or ROOT / "benchmark" / "results" / f"bench_serving_{model}_{ts.replace(':', '')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        # Warm-up (not timed): compiles kernels and captures graphs the first request would otherwise pay for.
        warm = stream_generate(base, make_prompts(1, min(args.random_input_len, 64), 4, 1.0, args.seed + 1)[0][0], 4,
                               args.request_timeout)  # fmt: skip
        if warm["error"]:
            raise RuntimeError(f"warm-up request failed: {warm['error']}")
        for i, c in enumerate(args.max_concurrency):
            n = args.num_prompts[min(i, len(args.num_prompts) - 1)] if args.num_prompts else max(2 * c, 8)
            prompts = make_prompts(n, args.random_input_len, args.random_output_len, args.random_range_ratio,
                                   args.seed)  # fmt: skip
            before, cpu0 = _counters(base), process_cpu(server)
            procs = client_processes(c, args.client_processes)
            results, duration = run_level(base, prompts, c, args.request_timeout, procs)
            run = summarize(results, duration, c)
            run["client_processes"] = procs
            after, cpu1 = _counters(base), process_cpu(server)
            if cpu0:
                # Per serving process (and this client): CPU seconds per output token over the level.
                # A process near 1 CPU-second per wall-second limits the token rate, not the GPU.
                run["cpu_us_per_output_token"] = {k: 1e6 * (cpu1[k] - cpu0[k]) / max(run["total_output_tokens"], 1)
                                                  for k in cpu1 if k in cpu0}  # fmt: skip
            run["mixed_steps"] = {k: after[k] - before.get(k, 0) for k in MIXED_COUNTERS if k in after}
            run["scheduler_counters"] = {k: after[k] - before.get(k, 0) for k in after if k not in MIXED_COUNTERS}
            if engine is not None:  # exact lengths only: with a range ratio the figure is approximate
                run["back_to_back"] = back_to_back(engine, c, n, args.random_input_len, args.random_output_len,
                                                   {**info, **states[0]})  # fmt: skip
                b2b = run["back_to_back"]
                run["output_throughput_over_back_to_back"] = run["output_throughput"] / b2b["output_throughput"]
                run["p99_ttft_over_prefill_all"] = run["p99_ttft_ms"] / 1e3 / b2b["prefill_all_s"]
            result["runs"].append(run)
            print_row(run)
            out.write_text(json.dumps(result, indent=2))  # after every level: a time limit keeps the finished ones
    finally:
        if server is not None:
            server.stop()
    print(f"wrote {out}")
    return result


def process_cpu(server) -> dict[str, float]:
    """CPU seconds so far of the launched server's processes (by the names they give themselves,
    subprocess_utils.name_process) and of this client; empty without a launched server or /proc."""
    if server is None or not Path("/proc/self/stat").exists():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    procs = {}  # pid -> (parent pid, name, CPU seconds)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                name, rest = d.joinpath("stat").read_text().split(" (", 1)[1].rsplit(") ", 1)
            except (OSError, ValueError, IndexError):
                continue
            f = rest.split()
            procs[int(d.name)] = (int(f[1]), name, (int(f[11]) + int(f[12])) / tick)
    out, stack = {}, [server.proc.pid]
    while stack:
        pid = stack.pop()
        if pid not in procs:
            continue
        name = "http (tokenizer manager)" if pid == server.proc.pid else procs[pid][1]
        out[name] = out.get(name, 0.0) + procs[pid][2]
        stack += [p for p, (ppid, _, _) in procs.items() if ppid == pid]
    t = os.times()  # with the client processes of finished levels (reaped children)
    out["client (this process)"] = t.user + t.system + t.children_user + t.children_system
    return out


MIXED_COUNTERS = ("num_mixed_steps", "num_mixed_decode_tokens")  # steps whose prefill carried decode tokens
# Counters a level's row carries the change of: what explains a slow level (evictions, retractions,
# steps that could not overlap).
COUNTERS = MIXED_COUNTERS + ("num_retracted_reqs", "overlap_decode_steps", "sync_decode_steps", "overlap_mixed_steps",
                             "overlap_prefill_steps")
COUNTER_PREFIXES = ("radix_evicted_", "radix_thinned_")


def _counters(base: str) -> dict:
    """The scheduler's counters (internal_states of /get_server_info) named by COUNTERS and COUNTER_PREFIXES."""
    status, data = request_json(base, "GET", "/get_server_info")
    st = (_loads(data).get("internal_states") or [{}])[0] if status == 200 else {}
    return {k: v for k, v in st.items() if k in COUNTERS or k.startswith(COUNTER_PREFIXES)}


def print_row(r: dict) -> None:
    print(f"concurrency {r['max_concurrency']:>4}: {r['completed']}/{r['num_prompts']} ok, "
          f"{r['output_throughput']:.1f} out tok/s, {r['request_throughput']:.2f} req/s, "
          f"TTFT mean/p99 {r['mean_ttft_ms']:.1f}/{r['p99_ttft_ms']:.1f} ms, "
          f"TPOT mean/p99 {r['mean_tpot_ms']:.2f}/{r['p99_tpot_ms']:.2f} ms, "
          f"ITL median/p99 {r['median_itl_ms']:.2f}/{r['p99_itl_ms']:.2f} ms", flush=True)  # fmt: skip
    b = r.get("back_to_back")
    if b:
        print(f"      back-to-back: {b['output_throughput']:.1f} out tok/s (waves of {b['wave_size']}, "
              f"{b['decode_step_ms']:.2f} ms/step, prefill {b['prefill_ms']:.1f} ms, all prefills "
              f"{b['prefill_all_s']:.2f} s); served/back-to-back {r['output_throughput_over_back_to_back']:.2f}, "
              f"TTFT p99 / all prefills {r['p99_ttft_over_prefill_all']:.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
