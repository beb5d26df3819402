"""RMSNorm and fused residual-add + RMSNorm kernels vs the model's rounding."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.rmsnorm import fused_add_rmsnorm, fused_add_rmsnorm_ref, rmsnorm, rmsnorm_ref  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SHAPES = [(1, 6144), (67, 6144), (5, 64, 128), (3, 100)] if CUDA else [(1, 64), (7, 100), (3, 4, 16)]


def _inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (2.0 * torch.randn(*shape, generator=g)).to(DEVICE, dtype)
    r = torch.randn(*shape, generator=g).to(DEVICE, dtype)
    w = (1.0 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEVICE, dtype)
    return x, r, w


def _tol(dtype):
    # One bf16 ulp of the output can differ where the fp32 rsqrt differs in its last bits.
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm(shape, dtype):
    x, _, w = _inputs(shape, dtype, sum(shape))
    got = rmsnorm(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, rmsnorm_ref(x, w, 1e-6), **_tol(dtype))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rmsnorm(shape, dtype):
    x, r, w = _inputs(shape, dtype, sum(shape) + 1)
    out, summed = fused_add_rmsnorm(x, r, w, 1e-6)
    out_ref, summed_ref = fused_add_rmsnorm_ref(x, r, w, 1e-6)
    if CUDA or dtype == torch.float32:
        assert torch.equal(summed, summed_ref)  # the new hidden state is rounded exactly like x + r
    else:
        # Triton's interpreter truncates fp32 -> bf16 instead of rounding to nearest: one ulp off.
        torch.testing.assert_close(summed, summed_ref, atol=0, rtol=2**-7)
    torch.testing.assert_close(out, out_ref, **_tol(dtype))
