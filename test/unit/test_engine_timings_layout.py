"""benchmark/engine_timings.py's `--decode-layout serving`: the slots it gives each sequence are a run
followed by a tail interleaved across the batch (what the server's one-slot-per-request decode steps
leave), checked against a layout built here by brute force, and a run on inkling-tiny on the CPU
records the layout in its JSON."""

from __future__ import annotations

import json

import torch

from benchmark import engine_timings


def _counter():
    nxt = [1]

    def alloc(n: int) -> torch.Tensor:
        out = torch.arange(nxt[0], nxt[0] + n)
        nxt[0] += n
        return out

    return alloc


def test_tail_slots_interleave_across_the_batch_as_decode_steps_allocate_them():
    bsz, n, tail = 3, 7, 4
    got = engine_timings._slots(_counter(), bsz, n, tail)
    # Brute force: each sequence's head in one run, then decode steps giving every sequence in turn
    # the next free slot.
    nxt, want = 1, []
    for _ in range(bsz):
        want.append(list(range(nxt, nxt + n - tail)))
        nxt += n - tail
    for _ in range(tail):
        for seq in want:
            seq.append(nxt)
            nxt += 1
    assert [g.tolist() for g in got] == want
    runs = engine_timings._slots(_counter(), bsz, n, 0)
    assert [g.tolist() for g in runs] == [list(range(1 + i * n, 1 + (i + 1) * n)) for i in range(bsz)]


def test_serving_layout_runs_on_tiny_and_records_it(tmp_path):
    out = tmp_path / "engine.json"
    d = engine_timings.main(["--config", "tiny", "--device", "cpu", "--input-len", "32", "--output-len", "8",
                             "--batch-size", "1", "3", "--decode-steps", "1", "--prefill-repeats", "1",
                             "--decode-layout", "serving", "--out", str(out)])  # fmt: skip
    assert json.loads(out.read_text())["decode_layout"] == "serving" == d["decode_layout"]
    assert set(d["decode_step_ms"]) == {"1", "3"} and all(v > 0 for v in d["decode_step_ms"].values())
