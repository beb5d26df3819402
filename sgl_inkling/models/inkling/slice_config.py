"""`inkling-slice`: Inkling at full width with only 3 trunk layers, for single-GPU benchmarks.

Every per-layer shape is the full model's (hidden 6144, 64 query heads, 8 / 16 KV heads, 256 routed
experts of width 3072 with 2 sink experts, real vocabulary), so per-layer timings scale to the
66-layer model. Trunk: sliding, sliding, full, all MoE; 8 MTP depths with their dense MLPs. About
100 GB in bf16; used with `--load-format dummy` (weights initialised on the device, no file).
Which MTP depths are sliding is not published with the shapes we have; we follow the trunk's
pattern (every sixth full), which only changes KV bytes, not the weights streamed per step.
"""

from __future__ import annotations

import copy

from sgl_inkling.models.inkling.config import InklingConfig

SLICE_NAME = "inkling-slice"
NUM_FULL_MODEL_LAYERS = 66
NUM_FULL_MODEL_SLIDING = 55

SLICE_CONFIG: dict = {
    "model_type": "inkling_mm_model",
    "architectures": ["InklingForConditionalGeneration"],
    "image_token_id": 200054,
    "audio_token_id": 200053,
    "image_bos_token_id": 200005,
    "audio_bos_token_id": 200020,
    "text_config": {
        "model_type": "inkling_text",
        "vocab_size": 201024,
        "unpadded_vocab_size": 200058,
        "hidden_size": 6144,
        "num_hidden_layers": 3,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "swa_num_attention_heads": 64,
        "swa_num_key_value_heads": 16,
        "swa_head_dim": 128,
        "sliding_window_size": 512,
        "d_rel": 16,
        "rel_extent": 1024,
        "log_scaling_n_floor": None,
        "log_scaling_alpha": 0.1,
        "layer_types": ["hybrid_sliding", "hybrid_sliding", "hybrid"],
        "mlp_layer_types": ["sparse", "sparse", "sparse"],
        "conv_kernel_size": 4,
        "intermediate_size": 24576,
        "moe_intermediate_size": 3072,
        "n_routed_experts": 256,
        "num_experts_per_tok": 6,
        "n_shared_experts": 2,
        "route_scale": 8.0,
        "logits_mup_width_multiplier": 24.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
    },
    "mtp_config": {
        "num_nextn_predict_layers": 8,
        "chain_hidden_post_norm": False,
        "local_layer_ids": [0, 1, 2, 3, 4, 6, 7],
    },
    "vision_config": {},
    "audio_config": {},
}


def slice_config() -> InklingConfig:
    return InklingConfig.from_dict(copy.deepcopy(SLICE_CONFIG))
