"""`inkling-tiny`: a small Inkling with the real tokenizer and vocabulary, written on first use.

Four trunk layers mix sliding and full attention and dense and MoE FFNs (with sink experts), eight
MTP depths (three sliding, five full), log scaling on, and small media towers: a two-step hMLP
vision encoder (40x40 patches, as the full model) and a dMel audio table of 16 bins. The weights are seeded random numbers scaled so
activations and logits stay O(1): a stand-in for a trained checkpoint in tests and demos.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from sgl_inkling.models.inkling.config import InklingConfig

TINY_NAME = "inkling-tiny"
_VERSION = 3
_SEED = 1234

TINY_CONFIG: dict = {
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
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 4,
        "swa_head_dim": 16,
        "sliding_window_size": 16,
        "d_rel": 4,
        "rel_extent": 32,
        "log_scaling_n_floor": 8,
        "log_scaling_alpha": 0.1,
        "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
        "conv_kernel_size": 4,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 2,
        "route_scale": 8.0,
        "logits_mup_width_multiplier": 4.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
    },
    "mtp_config": {"num_nextn_predict_layers": 8, "chain_hidden_post_norm": False, "local_layer_ids": [0, 3, 6]},
    "vision_config": {
        "model_type": "inkling_vision",
        "patch_size": 40,
        "temporal_patch_size": 2,
        # Two steps keep the tower small (~0.75M parameters); more steps pass through 4800 channels.
        "num_hidden_layers": 2,
    },
    "audio_config": {"model_type": "inkling_audio", "n_mel_bins": 80, "mel_vocab_size": 16},
}


def cache_root() -> Path:
    return Path(os.environ.get("SGLANG_INKLING_CACHE", Path.home() / ".cache" / "sglang-inkling"))


def random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A seeded weight with a scale that suits its role (never all zeros, so bugs show)."""
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name.endswith("global_scale"):
        return 1.0 + 0.05 * torch.randn(shape, generator=gen)
    if name.endswith("gate.bias"):
        return 0.1 * torch.randn(shape, generator=gen)
    if "sconv" in name:
        return 0.3 * torch.randn(shape, generator=gen)
    if name.endswith("rel_logits_proj.proj"):
        return 0.5 * torch.randn(shape, generator=gen)
    if name.endswith(("embed.weight", "unembed.weight")):
        return torch.randn(shape, generator=gen)
    # Linear-like [..., out, in]: unit-variance outputs for unit-variance inputs.
    return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])


def write_random_checkpoint(config: dict, out_dir: Path, seed: int = _SEED) -> None:
    """Write config.json and model.safetensors with hub tensor names (trunk, MTP and media towers)."""
    from sgl_inkling.model_executor.model_loader import build_model

    model = build_model(InklingConfig.from_dict(config), torch.float32, "meta", ("image", "audio"))
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        name: random_tensor(name, tuple(p.shape), gen).contiguous() for name, p in model.named_parameters()
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))


def ensure_tiny_checkpoint() -> Path:
    """Path of the inkling-tiny checkpoint, writing it on first use (safe under concurrent callers)."""
    target = cache_root() / f"{TINY_NAME}-v{_VERSION}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{TINY_NAME}-", dir=target.parent))
    try:
        write_random_checkpoint(TINY_CONFIG, tmp)
        try:
            tmp.rename(target)
        except OSError:
            pass  # another process finished first; its copy is identical
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
