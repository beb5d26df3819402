"""The Triton attention backend through the real inkling-tiny model, in Triton's CPU interpreter,
against the torch_native backend (fp32)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels._triton import kernel_dispatch  # noqa: E402

from .backend_scenario import run_scenario  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA variant lives in test/gpu")
def test_triton_backend_matches_torch_native_on_cpu(tiny_model):
    want, want_tokens = run_scenario(tiny_model, "torch_native")
    got, got_tokens = run_scenario(tiny_model, "triton")
    assert got_tokens == want_tokens
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-4, rtol=2e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA variant lives in test/gpu")
def test_all_kernels_match_reference_on_cpu(tiny_model):
    """Every kernel the model calls (in Triton's interpreter) plus the triton backend, vs the torch model."""
    want, want_tokens = run_scenario(tiny_model, "torch_native", decode_steps=2)
    with kernel_dispatch(True):
        got, got_tokens = run_scenario(tiny_model, "triton", decode_steps=2)
    assert got_tokens == want_tokens
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=5e-4, rtol=5e-4)
