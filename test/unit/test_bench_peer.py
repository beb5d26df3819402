"""benchmark/bench_peer.py on CPU with inkling-tiny at tiny sizes, and its out-of-memory back-off."""

from __future__ import annotations

import json

import pytest
import torch

from benchmark import bench_peer


def test_bench_peer_tiny_cpu_writes_its_figures(tmp_path):
    out = tmp_path / "peer.json"
    bench_peer.main(["--config", "tiny", "--device", "cpu", "--batch-size", "1", "--input-len", "6",
                     "--decode-steps", "2", "--extra-steps", "6", "--repeats", "1", "--result-file", str(out)])  # fmt: skip
    d = json.loads(out.read_text())
    assert d["benchmark"] == "bench_peer" and d["config"] == "inkling-tiny" and d["dtype"] == "float32"
    assert d["weights_gb"] > 0 and d["out_of_memory_batch_sizes"] == {}
    (run,) = d["runs"]
    assert (run["batch_size"], run["input_len"], run["generate_n_tokens"], run["generate_n_plus_k_tokens"]) == (1, 6, 2, 8)
    # Six more decode steps take longer; the step time is their difference per step.
    assert run["generate_n_plus_k_s"] > run["generate_n_s"] > 0
    assert abs(run["decode_step_ms"] - (run["generate_n_plus_k_s"] - run["generate_n_s"]) / 6 * 1e3) < 1e-6


def test_out_of_memory_halves_the_batch_until_it_fits(monkeypatch):
    tried = []

    def fake_measure(model, bsz, args, vocab, device):
        tried.append(bsz)
        if bsz > 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")
        return {"batch_size": bsz}

    monkeypatch.setattr(bench_peer, "measure", fake_measure)
    run, failed = bench_peer.run_batch_size(None, 64, None, 10, torch.device("cpu"))
    assert run == {"batch_size": 16} and failed == [64, 32] and tried == [64, 32, 16]

    def other_error(*a):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(bench_peer, "measure", other_error)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # a real bug is not an out-of-memory
        bench_peer.run_batch_size(None, 4, None, 10, torch.device("cpu"))
