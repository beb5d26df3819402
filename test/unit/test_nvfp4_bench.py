"""NVFP4 in the benchmarks: bench_one_batch's floor counts 0.5625 bytes per routed weight of the experts
hit (codes + fp8 block scales, plus scale2), and the memory plan's per-rank weights at TP 8 / EP 8 are
the routed experts' NVFP4 bytes from the config plus the BF16 rest."""

from __future__ import annotations

import json

import torch

from benchmark import bench_one_batch, tp_projection
from sgl_inkling.model_executor.model_loader import build_model, with_expert_quant
from sgl_inkling.models.inkling.config import InklingConfig
from sgl_inkling.models.inkling.slice_config import NUM_FULL_MODEL_LAYERS, slice_config
from sgl_inkling.models.inkling.tiny import TINY_CONFIG


def test_layer_floor_counts_nvfp4_bytes_of_the_experts_hit():
    config = InklingConfig.from_dict(TINY_CONFIG)
    t = config.text
    bf16 = build_model(config, torch.bfloat16, "meta")
    nvfp4 = build_model(with_expert_quant(config, "nvfp4"), torch.bfloat16, "meta")
    ids = torch.tensor([[0, 3], [3, 5]])  # three distinct experts hit
    lens = [20, 7]
    a = bench_one_batch.layer_floor_bytes(bf16.model.llm.layers[1], t, lens, ids)
    b = bench_one_batch.layer_floor_bytes(nvfp4.model.llm.layers[1], t, lens, ids)
    weights = 3 * t.moe_intermediate_size * t.hidden_size  # per expert: w13 (2I x H) and w2 (H x I)
    assert a - b == 3 * (weights * 2 - (weights * 0.5625 + 2 * 4))


def test_memory_plan_nvfp4_on_8_h200():
    cfg = slice_config().text
    nv, bf = tp_projection.project(slice_config(), 8, 8, "nvfp4"), tp_projection.project(slice_config(), 8, 8)
    per_rank_experts = cfg.n_routed_experts // 8
    weights = 3 * cfg.moe_intermediate_size * cfg.hidden_size
    routed = NUM_FULL_MODEL_LAYERS * per_rank_experts * (weights * 0.5625 + 2 * 4)
    assert abs(nv["routed_expert_weights_gb_per_rank"] * 1e9 - routed) < 1e3
    assert abs(bf["routed_expert_weights_gb_per_rank"] * 1e9 - NUM_FULL_MODEL_LAYERS * per_rank_experts * weights * 2) < 1e3
    # Only the routed experts change format.
    rest = lambda p: p["weights_gb_per_rank"] - p["routed_expert_weights_gb_per_rank"]  # noqa: E731
    assert abs(rest(nv) - rest(bf)) < 1e-6
    rows = {(r["gpu"], r["gpus"], r["ep"], r["routed_experts"]): r for r in tp_projection.plans()}
    h200 = rows[("H200", 8, 8, "nvfp4")]
    assert h200["fits"] and 60 < h200["weights_gib_per_rank"] < 80 and h200["kv_budget_gib_per_rank"] > 40
    # As upstream: 85% of the card holds weights and cache, the rest is left to activations.
    assert abs(h200["kv_budget_gib_per_rank"] - (0.85 * tp_projection.GPUS["H200"] / 2**30 - h200["weights_gib_per_rank"])) < 1e-6
    assert h200["longest_context_one_request"] == cfg.max_position_embeddings
    assert not rows[("H200", 8, 8, "bf16")]["fits"]  # BF16 Inkling needs two nodes
    two_nodes = tp_projection.project(slice_config(), 16, 16)  # and 95% of them for weights and cache
    assert not tp_projection.memory_plan(two_nodes, tp_projection.GPUS["H200"], 512, 131072)["fits"]
    assert tp_projection.memory_plan(two_nodes, tp_projection.GPUS["H200"], 512, 131072, 0.95)["fits"]


def test_static_budget_is_a_fraction_of_the_card_on_cuda_and_of_the_free_memory_on_cpu():
    from sgl_inkling.managers.scheduler_memory import static_budget

    gib = 2**30
    # 100 GiB of weights on a 140 GiB card: 0.85 x 140 - 100 = 19 GiB for the cache, 21 GiB left over.
    assert static_budget(True, 0.85, 40 * gib, 140 * gib) == int(0.85 * 140 * gib) - 100 * gib
    assert static_budget(True, 0.85, 10 * gib, 140 * gib) < 0  # weights past the fraction: refused later
    assert static_budget(False, 0.25, 16 * gib, 24 * gib) == 4 * gib


def test_bench_one_batch_nvfp4_smoke(tmp_path):
    out = tmp_path / "b.json"
    bench_one_batch.main(["--config", "tiny", "--device", "cpu", "--batch-size", "2", "--input-len", "20",
                          "--decode-steps", "2", "--warmup-steps", "1", "--prefill-repeats", "1",
                          "--quantization", "modelopt_fp4", "--result-file", str(out)])  # fmt: skip
    d = json.loads(out.read_text())
    assert d["config"] == "inkling-tiny-nvfp4" and d["routed_experts"] == "nvfp4"
    assert all(x["floor_ms"] > 0 for x in d["runs"][0]["layers"])
