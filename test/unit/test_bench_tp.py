"""benchmark/bench_tp.py on CPU: inkling-tiny at TP 1 and TP 2 (spawned gloo ranks), tiny sizes."""

from __future__ import annotations

import json

from benchmark import bench_tp


def test_bench_tp_tiny_cpu_compares_and_times_collectives(tmp_path):
    out = tmp_path / "tp.json"
    bench_tp.main(["--config", "tiny", "--device", "cpu", "--tp", "1", "2", "--batch-size", "2", "--input-len", "20",
                   "--decode-steps", "2", "--warmup-steps", "1", "--result-file", str(out)])  # fmt: skip
    d = json.loads(out.read_text())
    assert set(d["results"]) == {"tp1", "tp2"}
    tp1, tp2 = d["results"]["tp1"]["runs"][0], d["results"]["tp2"]["runs"][0]
    # TP 2 holds less than TP 1 per rank (the embedding and LM head stay whole) and talks.
    assert d["results"]["tp2"]["weights_gb_per_rank"] < d["results"]["tp1"]["weights_gb_per_rank"]
    assert tp1["comm_ms_per_layer"]["total"] == 0 and tp2["comm_ms_per_layer"]["reduce_scatter"] > 0
    assert tp2["comm_ms_per_layer"]["all_gather"] > 0 and len(tp2["layers"]) == 4
    # float32 on the CPU: the same greedy tokens (1 prefill + 3 decode steps per sequence).
    cmp = d["greedy_vs_tp1"]["tp2_bs2"]
    assert cmp["tokens_equal"] and cmp["steps_compared"] == 4
    assert cmp["first_step_logits_max_abs_diff"] < 1e-4
