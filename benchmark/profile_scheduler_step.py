"""Where a serving decode step's time goes on the host: the Scheduler run in this process (its own
event-loop step, sampling, commits and outputs; no HTTP) over a batch of running requests, timed per
step against the same batch's CUDA-graph replay alone (before and after the timed steps: the
contexts grow by one token a step), with medians per window of steps and a cProfile of the last ones.

    python benchmark/profile_scheduler_step.py --batch-size 64 --input-len 1024 \
        --out benchmark/results/profile_scheduler_step_inkling-slice-nvfp4_bs64.json \
        [--quantization modelopt_fp4]   # inkling-slice, dummy weights

At batch 64 the server's median inter-token latency was 14.45 ms against a 9.98 ms graph step
(gpu_serving.sh at f49cebb): with overlap scheduling the host's part of a step is hidden only while
it is shorter than the device's, so the step time here is max(host, device), and the profile says
which host work makes up the difference. Outputs go to a bound PULL socket drained every step, as
the detokenizer would.

--decode-kernel-profile N sets N served decode steps' device kernels beside N replays of the graph
alone: the served step's device span and the kernels it adds (copies into the graph's inputs, the
slot writes, sampling).

--sync-debug counts where the fill (mixed) and timed decode steps synchronize with the device (none
at c7d883e on the NVFP4 slice but the first prefill's read-back); --kernel-profile STEP lists the
device kernels of one fill step, to set beside profile_mixed_step.py's engine forward (the served
step's extra kernels were the short-conv snapshots: results/diagnostics/snapshots_4f30edc/).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_one_batch import git_commit, replay_ms  # noqa: E402
from benchmark.kernel_profile import kernel_rows  # noqa: E402
from benchmark.slice_dir import write_slice_dir  # noqa: E402
from sgl_inkling.managers.io_struct import TokenizedGenerateReq  # noqa: E402
from sgl_inkling.managers.scheduler import Scheduler  # noqa: E402
from sgl_inkling.model_executor.cuda_graph_runner import bucket_for  # noqa: E402
from sgl_inkling.model_resolution import resolve_model_path  # noqa: E402
from sgl_inkling.sampling.sampling_params import SamplingParams  # noqa: E402
from sgl_inkling.server_args import ServerArgs  # noqa: E402


def running_graph(s: Scheduler) -> torch.cuda.CUDAGraph:
    """The captured decode graph the running batch replays."""
    return s.runner.graphs.graphs[bucket_for(s.runner.graphs.buckets, len(s.running))]


def graph_replays(s: Scheduler, sync) -> tuple[float | None, float | None]:
    """The device's part alone, with the whole batch running: the batch's decode graph replayed one
    at a time and back to back (ms). Replays advance the requests' conv states (the outputs of dummy
    weights change, not the work)."""
    if s.runner.graphs is None:
        return None, None
    bucket = running_graph(s)
    one = statistics.median(replay_ms(bucket.replay, 20))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        bucket.replay()
    end.record()
    sync()
    return one, start.elapsed_time(end) / 100


def device_span_us(prof) -> float:
    """From the first CUDA kernel or copy's start to the last one's end (us): the device's busy time
    plus its idle gaps."""
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type.name == "CUDA"]
    return max(end for _, end in spans) - min(start for start, _ in spans) if spans else 0.0


def decode_step_kernels(s: Scheduler, step, sync, n: int) -> dict:
    """The device work of n served decode steps (overlapped, as served) against n back-to-back
    replays of the batch's graph: span and kernel time per step, and the kernels only the served
    steps launch (by name, calls and us per step): the step's work beside the graph."""
    graph = running_graph(s)
    cuda = [torch.profiler.ProfilerActivity.CUDA]
    sync()
    with torch.profiler.profile(activities=cuda) as served:
        for _ in range(n):
            step()
        sync()
    with torch.profiler.profile(activities=cuda) as alone:
        for _ in range(n):
            graph.replay()
        sync()
    mine, theirs = kernel_rows(served, n), {r["name"]: r for r in kernel_rows(alone, n)}
    extra = []
    for r in mine:
        g = theirs.get(r["name"], {"calls_per_step": 0.0, "us_per_step": 0.0})
        if r["calls_per_step"] > g["calls_per_step"] + 1e-9:
            extra.append({"name": r["name"], "calls_per_step": r["calls_per_step"] - g["calls_per_step"],
                          "us_per_step": r["us_per_step"] - g["us_per_step"]})  # fmt: skip
    return {
        "steps": n,
        # both start idle (synchronized): the difference is the served steps' own device time
        "served_span_us_per_step": device_span_us(served) / n,
        "graph_span_us_per_step": device_span_us(alone) / n,
        "served_kernel_us_per_step": sum(r["us_per_step"] for r in mine),
        "graph_kernel_us_per_step": sum(r["us_per_step"] for r in theirs.values()),
        "extra_kernels": sorted(extra, key=lambda r: -r["us_per_step"]),
    }


@contextlib.contextmanager
def sync_sites(record: dict[str, int] | None):
    """With a dict: count where the host synchronizes with the device inside the block (torch's sync
    debug mode warns at every implicit sync: .item(), .tolist() of a device tensor, a copy to pageable
    memory), keyed by the innermost project frames. An overlapped step must have none: each one
    leaves the GPU idle while the host catches up."""
    if record is None or not torch.cuda.is_available():
        yield
        return

    def show(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "/sgl_inkling" in f.filename]
        key = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-3:]))
        record[key or f"{filename}:{lineno}"] = record.get(key or f"{filename}:{lineno}", 0) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: inkling-slice (dummy weights)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100, help="timed steps (unprofiled)")
    ap.add_argument("--window", type=int, default=100, help="steps per median in step_ms_median_per_window")
    ap.add_argument("--profile-steps", type=int, default=50, help="cProfiled steps after the timed ones")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernel-profile", type=int, default=None, metavar="STEP",
                    help="the device kernels of fill step STEP (a served mixed step), synchronized alone")
    ap.add_argument("--decode-kernel-profile", type=int, default=None, metavar="N",
                    help="the device kernels of N served decode steps (overlapped, after the timed ones) "
                         "beside N back-to-back replays of the batch's graph alone: what a served step adds")
    ap.add_argument("--sync-debug", action="store_true",
                    help="record where fill (mixed) and timed decode steps synchronize with the device")
    a = ap.parse_args()
    if (a.kernel_profile is not None or a.decode_kernel_profile) and a.device != "cuda":
        raise SystemExit("--kernel-profile and --decode-kernel-profile need a CUDA device (they profile device kernels)")
    syncs = {"fill": {}, "decode": {}} if a.sync_debug else {"fill": None, "decode": None}
    path = str(resolve_model_path(a.model_path)) if a.model_path else str(write_slice_dir())
    args = ServerArgs(model_path=path, device=a.device, quantization=a.quantization, random_seed=0,
                      load_format="dummy" if a.model_path is None else "auto",
                      max_running_requests=max(a.batch_size, 1), cuda_graph_max_bs=max(a.batch_size, 1))  # fmt: skip
    args.check()
    d = tempfile.mkdtemp()
    out = zmq.Context.instance().socket(zmq.PULL)
    out.bind(f"ipc://{d}/out")
    s = Scheduler(args, path, f"ipc://{d}/in", f"ipc://{d}/out")
    sync = torch.cuda.synchronize if s.runner.device.type == "cuda" else (lambda: None)

    def drain() -> None:
        while out.poll(0):
            out.recv()

    def step() -> None:
        s.step()
        s.flush_outbox()
        drain()

    g = torch.Generator().manual_seed(0)
    # Enough tokens that no request finishes before the last profiled step: mixed prefill steps
    # already give the running requests a token each while the batch fills.
    max_new = a.steps + a.profile_steps + a.batch_size * (a.input_len // args.chunked_prefill_size + 2) + 20
    for i in range(a.batch_size):
        ids = torch.randint(0, 199_990, (a.input_len,), generator=g).tolist()
        sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, "max_new_tokens": max_new})
        s.handle(TokenizedGenerateReq(rid=f"r{i}", input_ids=ids, sampling_params=sp))
    fill_kernels = None
    fill = []  # while the batch fills: mixed steps (a prefill chunk and the running requests' tokens)
    while s.waiting or s.partial or len(s.running) < a.batch_size:
        riders = len(s.running)
        t = time.perf_counter()
        if len(fill) == a.kernel_profile:  # its forward and sampling alone in the window
            sync()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                step()
                sync()
            fill_kernels = {"step": len(fill), "riders": riders, "kernels": kernel_rows(prof, 1)}
            fill.append((None, 0))  # timed with syncs around it: not a served step's time
            continue
        with sync_sites(syncs["fill"]):
            step()
        fill.append(((time.perf_counter() - t) * 1e3, riders))
    for _ in range(10):  # warm: every request decoding, the pending step in flight
        step()
    sync()
    graph_first = graph_replays(s, sync)
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        with sync_sites(syncs["decode"]):
            step()
        times.append((time.perf_counter() - t) * 1e3)
    sync()
    graph_last = graph_replays(s, sync)
    decode_kernels = decode_step_kernels(s, step, sync, a.decode_kernel_profile) if a.decode_kernel_profile else None
    prof = cProfile.Profile()
    prof.enable()
    t = time.perf_counter()
    for _ in range(a.profile_steps):
        step()
    sync()
    prof_ms = (time.perf_counter() - t) * 1e3 / a.profile_steps
    prof.disable()
    finished = a.batch_size - len(s.running)
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumtime").print_stats("sgl_inkling", 30)
    w = a.window
    windows = [statistics.median(times[i : i + w]) for i in range(0, len(times), w)]
    commit, dirty = git_commit()
    report = {
        "benchmark": "profile_scheduler_step",
        "git_commit": commit,
        "git_dirty": dirty,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "model": path,
        "quantization": a.quantization,
        "batch_size": a.batch_size,
        "input_len": a.input_len,
        "overlap": s.overlap,
        "finished_before_the_end": finished,
        # overlapped, so a step's wall time is its predecessor's device time: the steps that found
        # requests running, which mixed their tokens in (all but the first few)
        "fill_step_kernels": fill_kernels,
        "decode_step_kernels": decode_kernels,
        "fill_step_ms_median": statistics.median([ms for ms, n in fill if n])
        if any(n for _, n in fill)
        else None,
        "fill_steps": len(fill),
        "fill_step_ms": [None if ms is None else round(ms, 2) for ms, _ in fill],
        "sync_sites": syncs if a.sync_debug else None,
        "steps": a.steps,
        "step_ms_median": statistics.median(times),
        "step_ms_mean": statistics.fmean(times),
        "step_ms_median_per_window": windows,
        "window_steps": w,
        "step_ms_profiled": prof_ms,
        "graph_replay_ms": graph_first[0],
        "graph_replay_sustained_ms": graph_first[1],
        "graph_replay_ms_after": graph_last[0],
        "graph_replay_sustained_ms_after": graph_last[1],
        "profile": buf.getvalue(),
    }
    print(buf.getvalue()[:6000])
    print(json.dumps({k: v for k, v in report.items() if k not in ("profile", "fill_step_ms")}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
