"""Build the model on its device in the target dtype, then fill it from a checkpoint or randomly."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path

import torch
from safetensors import safe_open

from sgl_inkling.models.inkling.config import SPARSE, InklingConfig
from sgl_inkling.models.inkling.model import InklingForCausalLM
from sgl_inkling.models.inkling.quant_config import (
    check_experts_quantized,
    detect_quantization,
    resolve_quantization,
)
from sgl_inkling.models.inkling.weights import (
    WeightLoadError,
    checkpoint_files,
    init_dummy_weights,
    load_safetensors,
    tower_modalities,
)

logger = logging.getLogger(__name__)
LOAD_FORMATS = ("auto", "safetensors", "dummy")
MTP_PREFIX = "model.mtp."


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(
    config: InklingConfig, dtype: torch.dtype, device: torch.device | str, modalities: tuple[str, ...] = ()
) -> InklingForCausalLM:
    """Allocate without initialising: parameters are created on `meta`, then materialised on `device`.

    Modules that must stay fp32 (short convs, router bias and scale) create their parameters in fp32.
    """
    with _default_dtype(dtype), torch.device("meta"):
        model = InklingForCausalLM(config, modalities)
    model = model.to_empty(device=device).eval()
    model.pack_weights()  # after to_empty, which replaces every parameter
    return model


def resolve_modalities(
    config: InklingConfig, model_path: str | Path, load_format: str, enable_multimodal: bool | None
) -> tuple[str, ...]:
    if enable_multimodal is False:
        return ()
    if load_format == "dummy":
        found = tuple(m for m, sub in (("image", config.vision), ("audio", config.audio)) if sub)
    else:
        found = tower_modalities(model_path)
    if enable_multimodal and not found:
        raise ValueError(f"--enable-multimodal: the checkpoint at {model_path} has no vision or audio tower")
    return found


def with_quantization(
    config: InklingConfig, model_path: str | Path, quantization: str | None, load_format: str
) -> InklingConfig:
    """The config with its routed experts' format set from the checkpoint and `--quantization`."""
    found = detect_quantization(model_path)
    method = resolve_quantization(quantization, found, load_format)
    check_experts_quantized(found, [i for i, t in enumerate(config.text.mlp_layer_types) if t == SPARSE])
    return with_expert_quant(config, method)


def with_expert_quant(config: InklingConfig, method: str | None) -> InklingConfig:
    """The config with routed experts in `method` (None: the activations' dtype, "nvfp4")."""
    return dataclasses.replace(config, text=dataclasses.replace(config.text, expert_quant=method))


def without_missing_mtp(config: InklingConfig, model_path: str | Path, need_mtp: bool) -> InklingConfig:
    """A config that declares MTP depths for a checkpoint without `model.mtp.*` tensors (one saved
    by transformers' Inkling port, which never writes them) serves without MTP; asking for
    speculative decoding on it is an error naming what is missing."""
    if config.text.mtp is None:
        return config
    for f in checkpoint_files(Path(model_path)):
        with safe_open(f, framework="pt", device="cpu") as sf:
            if any(name.startswith(MTP_PREFIX) for name in sf.keys()):
                return config
    n = config.text.mtp.num_layers
    if need_mtp:
        raise WeightLoadError(
            f"--speculative-algorithm MTP: the checkpoint at {model_path} has no {MTP_PREFIX}* tensors, "
            f"though its config declares {n} MTP layer(s) (checkpoints saved by transformers' Inkling port "
            "carry none); serve it without --speculative-algorithm"
        )
    logger.warning("checkpoint %s declares %d MTP layer(s) but has no %s* tensors: MTP disabled", model_path, n,
                   MTP_PREFIX)  # fmt: skip
    return dataclasses.replace(config, text=dataclasses.replace(config.text, mtp=None))


def load_model(
    model_path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    load_format: str = "auto",
    progress: bool = True,
    enable_multimodal: bool | None = False,
    quantization: str | None = None,
    need_mtp: bool = False,
    draft_quantization: str | None = None,
) -> InklingForCausalLM:
    """`enable_multimodal`: False builds the text model only; None (auto) builds the media towers
    the checkpoint has; True requires at least one. `quantization` (`--quantization`): None takes the
    checkpoint's; an NVFP4 name must match it (or, with dummy weights, makes the routed experts NVFP4).
    `need_mtp`: speculative decoding will run. `draft_quantization`
    (--speculative-draft-model-quantization): "fp8" stores the MTP depths' dense weights in fp8."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"--load-format must be one of {LOAD_FORMATS}, got {load_format!r}")
    config = with_quantization(InklingConfig.from_file(model_path), model_path, quantization, load_format)
    if load_format != "dummy":
        config = without_missing_mtp(config, model_path, need_mtp)
    modalities = resolve_modalities(config, model_path, load_format, enable_multimodal)
    model = build_model(config, dtype, device, modalities)
    if load_format == "dummy":
        init_dummy_weights(model)
    else:
        load_safetensors(model, model_path, progress=progress)
    quantize_drafts(model, draft_quantization)
    return model


def quantize_drafts(model: InklingForCausalLM, method: str | None) -> None:
    """Apply --speculative-draft-model-quantization to the loaded model's MTP depths (None and "unquant":
    as the checkpoint has them)."""
    if method in (None, "unquant"):
        return
    if method != "fp8":
        raise ValueError(f"--speculative-draft-model-quantization must be fp8 or unquant, got {method!r}")
    mtp = model.model.mtp
    if mtp is None:
        raise ValueError("--speculative-draft-model-quantization fp8: the model has no MTP depths")
    saved = mtp.quantize_fp8()
    if next(model.parameters()).is_cuda:
        torch.cuda.empty_cache()  # the BF16 weights' blocks, before the pools are sized from free memory
    logger.info("MTP depths' dense weights in fp8: %.2f GB less", saved / 1e9)
