"""Inkling configuration read from a hub `config.json`, validated before anything is built."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SLIDING, FULL = "hybrid_sliding", "hybrid"
DENSE, SPARSE = "dense", "sparse"


class ConfigError(ValueError):
    """A config.json that is missing a field or contradicts itself."""


# Fields with no sensible default: their absence means the file is not an Inkling config.
_REQUIRED_TEXT = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "swa_num_attention_heads", "swa_num_key_value_heads", "swa_head_dim", "sliding_window_size",
    "d_rel", "rel_extent", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
    "moe_intermediate_size", "intermediate_size", "route_scale", "logits_mup_width_multiplier",
    "vocab_size",
)  # fmt: skip


@dataclass(frozen=True)
class MTPConfig:
    num_layers: int
    layer_types: tuple[str, ...]
    chain_hidden_post_norm: bool
    hidden_states_first: bool


@dataclass(frozen=True)
class InklingTextConfig:
    vocab_size: int
    unpadded_vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    swa_num_attention_heads: int
    swa_num_key_value_heads: int
    swa_head_dim: int
    sliding_window_size: int
    d_rel: int
    rel_extent: int
    log_scaling_n_floor: int | None
    log_scaling_alpha: float
    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    conv_kernel_size: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    route_scale: float
    logits_mup_width_multiplier: float
    rms_norm_eps: float
    max_position_embeddings: int
    mtp: MTPConfig | None
    # Weight format of the routed experts: None (the activations' dtype) or "nvfp4" (set by the
    # loader from the checkpoint's quantization config, see quant_config.py).
    expert_quant: str | None = None

    def attn_shape(self, sliding: bool) -> tuple[int, int, int]:
        """(query heads, kv heads, head dim) of a sliding or full attention layer."""
        if sliding:
            return self.swa_num_attention_heads, self.swa_num_key_value_heads, self.swa_head_dim
        return self.num_attention_heads, self.num_key_value_heads, self.head_dim

    def rel_extent_of(self, sliding: bool) -> int:
        return self.sliding_window_size if sliding else self.rel_extent


@dataclass(frozen=True)
class InklingConfig:
    text: InklingTextConfig
    vision: dict[str, Any] = field(default_factory=dict)
    audio: dict[str, Any] = field(default_factory=dict)
    image_token_id: int = 200054
    audio_token_id: int = 200053
    image_bos_token_id: int = 200005
    audio_bos_token_id: int = 200020
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_file(cls, path: str | Path) -> InklingConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"no config.json at {path}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> InklingConfig:
        model_type = raw.get("model_type")
        if model_type != "inkling_mm_model":
            raise ConfigError(f"config.json: model_type is {model_type!r}, expected 'inkling_mm_model'")
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError("config.json: missing field 'text_config'")
        for name in ("vision_config", "audio_config"):
            if name in raw and not isinstance(raw[name], dict):
                raise ConfigError(f"config.json: field '{name}' must be an object")
        return cls(
            text=_parse_text(text, raw.get("mtp_config") or {}),
            vision=dict(raw.get("vision_config") or {}),
            audio=dict(raw.get("audio_config") or {}),
            image_token_id=int(raw.get("image_token_id", 200054)),
            audio_token_id=int(raw.get("audio_token_id", 200053)),
            image_bos_token_id=int(raw.get("image_bos_token_id", 200005)),
            audio_bos_token_id=int(raw.get("audio_bos_token_id", 200020)),
            raw=raw,
        )


def _int(t: dict, name: str, minimum: int = 1) -> int:
    v = t[name]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"text_config.{name} must be an integer >= {minimum}, got {v!r}")
    return v


def _float(t: dict, name: str, default: float | None = None) -> float:
    v = t.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"text_config.{name} must be a finite number, got {v!r}")
    return float(v)


def _layer_types(t: dict, n: int) -> tuple[str, ...]:
    if t.get("layer_types") is not None:
        types = tuple(t["layer_types"])
    else:
        local = t.get("local_layer_ids")
        local = set(local) if local is not None else {i for i in range(n) if (i + 1) % 6}
        types = tuple(SLIDING if i in local else FULL for i in range(n))
    if len(types) != n or any(x not in (SLIDING, FULL) for x in types):
        raise ConfigError(
            f"text_config.layer_types must list {n} entries of {SLIDING!r}/{FULL!r}, got {list(types)}"
        )
    return types


def _mlp_types(t: dict, n: int) -> tuple[str, ...]:
    if t.get("mlp_layer_types") is not None:
        types = tuple(t["mlp_layer_types"])
    else:
        dense_idx = t.get("dense_mlp_idx", 0)
        types = tuple(DENSE if i < dense_idx else SPARSE for i in range(n))
    if len(types) != n or any(x not in (DENSE, SPARSE) for x in types):
        raise ConfigError(
            f"text_config.mlp_layer_types must list {n} entries of 'dense'/'sparse', got {list(types)}"
        )
    return types


def _parse_mtp(t: dict, mtp_cfg: dict) -> MTPConfig | None:
    n = t.get("num_mtp_layers", mtp_cfg.get("num_nextn_predict_layers"))
    if not n:
        return None
    if not isinstance(n, int) or n < 0:
        raise ConfigError(f"mtp_config.num_nextn_predict_layers must be a non-negative integer, got {n!r}")
    local = t.get("mtp_local_layer_ids", mtp_cfg.get("local_layer_ids"))
    local = set(local or ())
    if any(not 0 <= i < n for i in local):
        raise ConfigError(f"mtp_config.local_layer_ids {sorted(local)} out of range for {n} MTP layers")
    return MTPConfig(
        num_layers=n,
        layer_types=tuple(SLIDING if i in local else FULL for i in range(n)),
        chain_hidden_post_norm=bool(
            t.get("chain_hidden_post_norm", mtp_cfg.get("chain_hidden_post_norm", False))
        ),
        hidden_states_first=bool(
            t.get("mtp_hidden_states_first", mtp_cfg.get("mtp_hidden_states_first", True))
        ),
    )


def _parse_text(t: dict, mtp_cfg: dict) -> InklingTextConfig:
    t = dict(t)
    if "conv_kernel_size" not in t and "sconv_kernel_size" in t:
        t["conv_kernel_size"] = t["sconv_kernel_size"]
    for name in _REQUIRED_TEXT:
        if name not in t or t[name] is None:
            raise ConfigError(f"config.json: missing field 'text_config.{name}'")
    # Older configs name the MoE width `intermediate_size` and the dense width `dense_intermediate_size`.
    if t.get("dense_intermediate_size") is not None:
        t["moe_intermediate_size"], t["intermediate_size"] = (
            t["intermediate_size"],
            t["dense_intermediate_size"],
        )
    n = _int(t, "num_hidden_layers")
    vocab = _int(t, "vocab_size")
    unpadded = t.get("unpadded_vocab_size") or vocab
    if not isinstance(unpadded, int) or not 0 < unpadded <= vocab:
        raise ConfigError(
            f"text_config.unpadded_vocab_size ({unpadded!r}) must be in [1, vocab_size={vocab}]"
        )
    n_floor = t.get("log_scaling_n_floor")
    if n_floor is not None and (not isinstance(n_floor, int) or n_floor < 1):
        raise ConfigError(f"text_config.log_scaling_n_floor must be null or an integer >= 1, got {n_floor!r}")
    cfg = InklingTextConfig(
        vocab_size=vocab,
        unpadded_vocab_size=unpadded,
        hidden_size=_int(t, "hidden_size"),
        num_hidden_layers=n,
        num_attention_heads=_int(t, "num_attention_heads"),
        num_key_value_heads=_int(t, "num_key_value_heads"),
        head_dim=_int(t, "head_dim"),
        swa_num_attention_heads=_int(t, "swa_num_attention_heads"),
        swa_num_key_value_heads=_int(t, "swa_num_key_value_heads"),
        swa_head_dim=_int(t, "swa_head_dim"),
        sliding_window_size=_int(t, "sliding_window_size"),
        d_rel=_int(t, "d_rel"),
        rel_extent=_int(t, "rel_extent"),
        log_scaling_n_floor=n_floor,
        log_scaling_alpha=_float(t, "log_scaling_alpha", 0.1),
        layer_types=_layer_types(t, n),
        mlp_layer_types=_mlp_types(t, n),
        conv_kernel_size=_int(t, "conv_kernel_size", 2) if "conv_kernel_size" in t else 4,
        intermediate_size=_int(t, "intermediate_size"),
        moe_intermediate_size=_int(t, "moe_intermediate_size"),
        n_routed_experts=_int(t, "n_routed_experts"),
        num_experts_per_tok=_int(t, "num_experts_per_tok"),
        n_shared_experts=_int(t, "n_shared_experts", 0),
        route_scale=_float(t, "route_scale"),
        logits_mup_width_multiplier=_float(t, "logits_mup_width_multiplier"),
        rms_norm_eps=_float(t, "rms_norm_eps", 1e-6),
        max_position_embeddings=int(t.get("max_position_embeddings", 131072)),
        mtp=_parse_mtp(t, mtp_cfg),
    )
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ConfigError(
            f"text_config.num_attention_heads ({cfg.num_attention_heads}) is not a multiple of "
            f"num_key_value_heads ({cfg.num_key_value_heads})"
        )
    if cfg.swa_num_attention_heads % cfg.swa_num_key_value_heads:
        raise ConfigError(
            f"text_config.swa_num_attention_heads ({cfg.swa_num_attention_heads}) is not a multiple of "
            f"swa_num_key_value_heads ({cfg.swa_num_key_value_heads})"
        )
    if cfg.num_experts_per_tok > cfg.n_routed_experts:
        raise ConfigError(
            f"text_config.num_experts_per_tok ({cfg.num_experts_per_tok}) exceeds n_routed_experts "
            f"({cfg.n_routed_experts})"
        )
    if SPARSE in cfg.mlp_layer_types and cfg.n_shared_experts < 1:
        raise ConfigError("text_config.n_shared_experts must be >= 1: the router's sink experts need it")
    return cfg
