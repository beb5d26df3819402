"""Build the model on its device in the target dtype, then fill it from a checkpoint or randomly."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from sgl_inkling.models.inkling.config import InklingConfig
from sgl_inkling.models.inkling.model import InklingForCausalLM
from sgl_inkling.models.inkling.weights import init_dummy_weights, load_safetensors

LOAD_FORMATS = ("auto", "safetensors", "dummy")


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(config: InklingConfig, dtype: torch.dtype, device: torch.device | str) -> InklingForCausalLM:
    """Allocate without initialising: parameters are created on `meta`, then materialised on `device`.

    Modules that must stay fp32 (short convs, router bias and scale) create their parameters in fp32.
    """
    with _default_dtype(dtype), torch.device("meta"):
        model = InklingForCausalLM(config)
    return model.to_empty(device=device).eval()


def load_model(
    model_path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    load_format: str = "auto",
    progress: bool = True,
) -> InklingForCausalLM:
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"--load-format must be one of {LOAD_FORMATS}, got {load_format!r}")
    config = InklingConfig.from_file(model_path)
    model = build_model(config, dtype, device)
    if load_format == "dummy":
        init_dummy_weights(model)
    else:
        load_safetensors(model, model_path, progress=progress)
    return model
