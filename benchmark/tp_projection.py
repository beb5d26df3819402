"""What one TP rank holds and sends for the 66-layer Inkling, from the slice's per-layer shapes, and
the memory plan that follows on a given GPU.

The model is built on the meta device at the target TP / EP size (nothing is allocated), so the
figures come from the same sharding code that serves: weights per rank (bf16, or NVFP4 routed
experts: uint8 codes, fp8 block scales, fp32 scale2), KV bytes per token, short-conv state per
request, and the bytes the output-conv collectives move per token per layer. Assumes every trunk
layer is MoE (as in the slice). MTP depths are counted in the weights (the checkpoint has them).

    python benchmark/tp_projection.py        # writes benchmark/results/memory_plan_inkling.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from sgl_inkling.distributed.parallel_state import ParallelState, get_parallel, set_parallel  # noqa: E402
from sgl_inkling.managers import scheduler_memory  # noqa: E402
from sgl_inkling.model_executor.model_loader import build_model, with_expert_quant  # noqa: E402
from sgl_inkling.models.inkling.config import SLIDING, InklingConfig  # noqa: E402
from sgl_inkling.models.inkling.quant_config import NVFP4  # noqa: E402
from sgl_inkling.models.inkling.slice_config import (  # noqa: E402
    NUM_FULL_MODEL_LAYERS,
    NUM_FULL_MODEL_SLIDING,
    slice_config,
)

BF16 = 2
GIB = 2**30
DEFAULT_MEM_FRACTION = 0.85  # --mem-fraction-static default on cuda (server_args)
# GPUs: memory torch can allocate. H200: 139 GiB seen on the test machine (141 GB HBM3e). H100 80GB:
# 79 GiB assumed (80 GiB HBM3 less the CUDA context; not measured here).
GPUS = {"H200": 139 * GIB, "H100-80GB": 79 * GIB}


def _nbytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def project(config: InklingConfig, tp: int, ep: int = 1, expert_quant: str | None = None) -> dict:
    saved = get_parallel()
    set_parallel(ParallelState(tp_size=tp, tp_rank=0, ep_size=ep))
    try:
        model = build_model(with_expert_quant(config, expert_quant), torch.bfloat16, "meta")
    finally:
        set_parallel(saved)
    cfg, llm = config.text, model.model.llm
    n_full = NUM_FULL_MODEL_LAYERS - NUM_FULL_MODEL_SLIDING
    kinds = {SLIDING: NUM_FULL_MODEL_SLIDING, "full": n_full}
    layer_of = {k: next(i for i, t in enumerate(cfg.layer_types) if (t == SLIDING) == (k == SLIDING)) for k in kinds}
    trunk = sum(n * _nbytes(llm.layers[layer_of[k]]) for k, n in kinds.items())
    routed = sum(n * _nbytes(llm.layers[layer_of[k]].mlp.experts) for k, n in kinds.items())
    rest = _nbytes(model) - sum(_nbytes(layer) for layer in llm.layers)  # embed, head, norms, MTP depths
    kv = {k: n * 2 * llm.layers[layer_of[k]].attn.spec.num_kv_heads * cfg.head_dim * BF16 for k, n in kinds.items()}
    chans = model.sconv_channels()
    conv = sum(n * 4 * (cfg.conv_kernel_size - 1) * sum(chans[layer_of[k]]) for k, n in kinds.items())
    # Two reduce-scatters and two all-gathers of H bf16 values per layer; a ring moves (tp-1)/tp of each.
    comm = 4 * (tp - 1) / tp * cfg.hidden_size * BF16
    return {
        "tp": tp,
        "ep": ep,
        "routed_experts": expert_quant or "bf16",
        "weights_gb_per_rank": (trunk + rest) / 1e9,
        "routed_expert_weights_gb_per_rank": routed / 1e9,
        "kv_bytes_per_token_per_rank_full_layers": kv["full"],
        "kv_bytes_per_token_per_rank_sliding_layers": kv[SLIDING],  # for the last window tokens only
        "sconv_state_bytes_per_request_per_rank": conv,
        "comm_bytes_per_token_per_layer_per_rank": comm,
        "comm_bytes_per_token_per_rank_66_layers": comm * NUM_FULL_MODEL_LAYERS,
    }


def memory_plan(
    p: dict, usable_bytes: int, window: int, context_len: int, fraction: float = DEFAULT_MEM_FRACTION
) -> dict:
    """KV capacity on one rank as scheduler_memory.size_pools sizes it on cuda (MTP off, defaults):
    budget = fraction x the GPU's memory, less the weights (static_budget); the sliding window of every running request
    and the short-conv state plus its checkpoints are set aside; the rest holds tokens at full +
    sliding KV bytes each. One request can hold all of those tokens (the full layers keep every one),
    up to the context length."""
    running = scheduler_memory._CUDA_MAX_RUNNING
    weights = p["weights_gb_per_rank"] * 1e9
    full_b, swa_b = p["kv_bytes_per_token_per_rank_full_layers"], p["kv_bytes_per_token_per_rank_sliding_layers"]
    free = usable_bytes - weights
    budget = scheduler_memory.static_budget(True, fraction, int(free), usable_bytes)
    ckpt = 2 * running * p["sconv_state_bytes_per_request_per_rank"]
    reserve = running * (window + 1) * swa_b + ckpt
    tokens = int((budget - reserve) // (full_b + swa_b)) if budget > reserve else 0
    return {
        "usable_gib": usable_bytes / GIB,
        "weights_gib_per_rank": weights / GIB,
        "fits": free > 0 and tokens > 0,
        "mem_fraction_static": fraction,
        "kv_budget_gib_per_rank": max(0.0, budget) / GIB,
        "reserved_for_running_requests_gib": reserve / GIB,
        "max_running_requests": running,
        "max_total_tokens": tokens,
        "longest_context_one_request": min(tokens, context_len),
        "context_limited": tokens >= context_len,
    }


def plans(usable: dict[str, int] = GPUS) -> list[dict]:
    config = slice_config()
    window, context = config.text.sliding_window_size, config.text.max_position_embeddings
    out = []
    for gpu, tp, ep, quant in (
        ("H200", 8, 8, NVFP4), ("H200", 8, 1, NVFP4), ("H200", 8, 8, None), ("H200", 16, 16, None),
        ("H100-80GB", 8, 8, NVFP4), ("H100-80GB", 16, 16, NVFP4),
    ):  # fmt: skip
        p = project(config, tp, ep, quant)
        out.append({"gpu": gpu, "gpus": tp, **p, **memory_plan(p, usable[gpu], window, context)})
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--result-file", type=Path, default=ROOT / "benchmark" / "results" / "memory_plan_inkling.json")
    args = a.parse_args(argv)
    rows = plans()
    result = {
        "benchmark": "tp_projection",
        "model": "Inkling (66 layers: 55 sliding + 11 full, all MoE) from inkling-slice shapes, meta device",
        "max_position_embeddings": slice_config().text.max_position_embeddings,
        "plans": rows,
    }
    args.result_file.parent.mkdir(parents=True, exist_ok=True)
    args.result_file.write_text(json.dumps(result, indent=1))
    print(f"{'gpu':>10} {'gpus':>4} {'ep':>3} {'experts':>7} {'weights GiB':>11} {'KV GiB':>7} "
          f"{'KV B/tok full+swa':>17} {'conv B/req':>10} {'max tokens':>10} {'1 request':>9}")  # fmt: skip
    for r in rows:
        kv = r["kv_bytes_per_token_per_rank_full_layers"] + r["kv_bytes_per_token_per_rank_sliding_layers"]
        print(f"{r['gpu']:>10} {r['gpus']:>4} {r['ep']:>3} {r['routed_experts']:>7} {r['weights_gib_per_rank']:>11.1f} "
              f"{r['kv_budget_gib_per_rank']:>7.1f} {kv:>17} {r['sconv_state_bytes_per_request_per_rank']:>10} "
              f"{r['max_total_tokens']:>10} {r['longest_context_one_request']:>9}")  # fmt: skip
    print(f"wrote {args.result_file}")
    return rows


if __name__ == "__main__":
    main()
