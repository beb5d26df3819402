"""Where a cached prompt's first token waits, in the scheduler alone (no HTTP): an 8K prompt is
prefilled and finished, then sent again (one new token on its cached prefix) with overlap scheduling
on and off; per run, ms from the request's arrival to the end of its prefill step, to the commit that
reads its token, and to the token in the outbox.

    python benchmark/probe_first_token.py [--quantization modelopt_fp4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.slice_dir import write_slice_dir  # noqa: E402
from sgl_inkling.managers.io_struct import TokenizedGenerateReq  # noqa: E402
from sgl_inkling.managers.scheduler import Scheduler  # noqa: E402
from sgl_inkling.sampling.sampling_params import SamplingParams  # noqa: E402
from sgl_inkling.server_args import ServerArgs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input-len", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    path = str(write_slice_dir())
    args = ServerArgs(model_path=path, device="cuda", quantization=a.quantization, random_seed=0,
                      load_format="dummy", max_running_requests=8, cuda_graph_max_bs=8)  # fmt: skip
    args.check()
    d = tempfile.mkdtemp()
    out = zmq.Context.instance().socket(zmq.PULL)
    out.bind(f"ipc://{d}/out")
    s = Scheduler(args, path, f"ipc://{d}/in", f"ipc://{d}/out")
    ids = torch.randint(0, 199_990, (a.input_len,), generator=torch.Generator().manual_seed(0)).tolist()
    marks: dict[str, float] = {}
    real_prefill, real_commit = s.run_prefill, s.commit_pending

    def run_prefill():
        r = real_prefill()
        marks.setdefault("prefill_step_returned", time.perf_counter())
        return r

    def commit_pending():
        if s.pending is not None and any(r.rid == marks.get("rid") for r in s.pending.reqs):
            marks.setdefault("commit_started", time.perf_counter())
        real_commit()

    s.run_prefill, s.commit_pending = run_prefill, commit_pending

    def send(rid: str, n: int) -> list[int]:
        sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, "max_new_tokens": n})
        marks.clear()
        marks["rid"] = rid
        t0 = time.perf_counter()
        s.handle(TokenizedGenerateReq(rid=rid, input_ids=ids, sampling_params=sp))
        first = None
        while s.waiting or s.running or s.partial or s.pending is not None:
            s.step()
            if first is None and any(m.rid == rid and m.output_ids for m in s.outbox):
                first = time.perf_counter()
            s.flush_outbox()
            while out.poll(0):
                out.recv()
        return [round((marks.get(k, float("nan")) - t0) * 1e3, 2) for k in ("prefill_step_returned", "commit_started")] + [
            round((first - t0) * 1e3, 2)]

    send("warm", 2)  # prefill and cache the prompt
    rows = {}
    for overlap in (True, False, True, False):
        s.overlap = overlap
        key = "overlap" if overlap else "sync"
        for i in range(a.repeats):
            rows.setdefault(key, []).append(send(f"{key}{i}", 4))
    summary = {k: [statistics.median(col) for col in zip(*v)] for k, v in rows.items()}
    print("median ms from arrival: [prefill step returned, commit of its token started, token in outbox]")
    for k, v in summary.items():
        print(f"{k:>8}: {v}")
    if a.out:
        Path(a.out).write_text(json.dumps({"benchmark": "probe_first_token", "input_len": a.input_len,
                                           "quantization": a.quantization, "runs": rows, "median": summary}, indent=1))


if __name__ == "__main__":
    main()
