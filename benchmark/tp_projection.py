"""What one TP rank holds and sends for the 66-layer Inkling, from the slice's per-layer shapes.

The model is built on the meta device at the target TP size (nothing is allocated), so the figures
come from the same sharding code that serves: weights per rank, KV bytes per token, short-conv
state per request, and the bytes the output-conv collectives move per token per layer. Assumes
every trunk layer is MoE (as in the slice) and bf16 weights (NVFP4 experts would quarter the
routed-expert share).
"""

from __future__ import annotations

import torch

from sgl_inkling.distributed.parallel_state import ParallelState, get_parallel, set_parallel
from sgl_inkling.model_executor.model_loader import build_model
from sgl_inkling.models.inkling.config import SLIDING, InklingConfig
from sgl_inkling.models.inkling.slice_config import NUM_FULL_MODEL_LAYERS, NUM_FULL_MODEL_SLIDING

BF16 = 2


def _nbytes(module) -> int:
    return sum(p.numel() * BF16 for p in module.parameters())


def project(config: InklingConfig, tp: int, ep: int = 1) -> dict:
    saved = get_parallel()
    set_parallel(ParallelState(tp_size=tp, tp_rank=0, ep_size=ep))
    try:
        model = build_model(config, torch.bfloat16, "meta")
    finally:
        set_parallel(saved)
    cfg, llm = config.text, model.model.llm
    n_full = NUM_FULL_MODEL_LAYERS - NUM_FULL_MODEL_SLIDING
    kinds = {SLIDING: NUM_FULL_MODEL_SLIDING, "full": n_full}
    layer_of = {k: next(i for i, t in enumerate(cfg.layer_types) if (t == SLIDING) == (k == SLIDING)) for k in kinds}
    trunk = sum(n * _nbytes(llm.layers[layer_of[k]]) for k, n in kinds.items())
    rest = _nbytes(model) - sum(_nbytes(layer) for layer in llm.layers)  # embed, head, norms, MTP depths
    kv = {k: n * 2 * llm.layers[layer_of[k]].attn.spec.num_kv_heads * cfg.head_dim * BF16 for k, n in kinds.items()}
    chans = model.sconv_channels()
    conv = sum(n * 4 * (cfg.conv_kernel_size - 1) * sum(chans[layer_of[k]]) for k, n in kinds.items())
    # Two reduce-scatters and two all-gathers of H bf16 values per layer; a ring moves (tp-1)/tp of each.
    comm = 4 * (tp - 1) / tp * cfg.hidden_size * BF16
    return {
        "tp": tp,
        "ep": ep,
        "weights_gb_per_rank": (trunk + rest) / 1e9,
        "kv_bytes_per_token_per_rank_full_layers": kv["full"],
        "kv_bytes_per_token_per_rank_sliding_layers": kv[SLIDING],  # for the last window tokens only
        "sconv_state_bytes_per_request_per_rank": conv,
        "comm_bytes_per_token_per_layer_per_rank": comm,
        "comm_bytes_per_token_per_rank_66_layers": comm * NUM_FULL_MODEL_LAYERS,
    }
