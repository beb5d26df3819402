"""Shared fixtures: the inkling-tiny checkpoint, our model and the transformers reference on it."""

from __future__ import annotations

import os

import pytest
import torch

# Tests run with the CPU's full precision and a deterministic thread count.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def tiny_path():
    from sgl_inkling.models.inkling.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint()


@pytest.fixture(scope="session")
def tiny_model(tiny_path):
    from sgl_inkling.model_executor.model_loader import load_model

    return load_model(tiny_path, torch.float32, "cpu", progress=False)


@pytest.fixture(scope="session")
def hf_model(tiny_path):
    """The transformers port (eager attention: the only path that applies the relative bias)."""
    from transformers import InklingForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = InklingForConditionalGeneration.from_pretrained(
        tiny_path, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()
