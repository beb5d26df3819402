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


def test_projection_of_the_66_layer_model_per_rank():
    from benchmark.tp_projection import project
    from sgl_inkling.models.inkling.slice_config import slice_config

    one, two, eight = (project(slice_config(), n) for n in (1, 2, 8))
    assert 1800 < one["weights_gb_per_rank"] < 2100  # about 975B parameters in bf16
    # Everything but the embedding and LM head (about 5 GB, replicated) splits.
    assert 0 < two["weights_gb_per_rank"] - one["weights_gb_per_rank"] / 2 < 6
    for key in ("sconv_state_bytes_per_request_per_rank", "kv_bytes_per_token_per_rank_full_layers",
                "kv_bytes_per_token_per_rank_sliding_layers"):  # fmt: skip
        assert two[key] * 2 == one[key] and eight[key] * 8 == one[key]
    # 11 full layers x 8 KV heads x 128 x (K, V) x bf16 at TP 1; one head per rank at TP 8.
    assert one["kv_bytes_per_token_per_rank_full_layers"] == 11 * 8 * 128 * 2 * 2
    assert one["comm_bytes_per_token_per_layer_per_rank"] == 0
    assert eight["comm_bytes_per_token_per_layer_per_rank"] == 4 * 7 / 8 * 6144 * 2
