"""The decode projections' Triton GEMV (dense_gemv.py) against a brute force written here: float64
products over the whole K, rounded once to the activation dtype. Odd shapes: N not a multiple of the
row band, K not a multiple of the K step nor of the columns loaded before the wait, K shorter than
those; batches 1, 3 and 16; fp32 (tight: layout and semantics) and bf16 (Triton's interpreter casts
fp32 to bf16 by truncation where the GPU rounds to nearest). On a GPU the same cases run in real
Triton, with programmatic dependent launches where the GPU has them, and also against cuBLAS."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from sgl_inkling.layers.linear import decode_linear, linear
from sgl_inkling_kernels._triton import interpreting, kernel_dispatch
from sgl_inkling_kernels.dense_gemv import MAX_TOKENS, GemvTiles, applies, cublas_projections, dense_gemv
from sgl_inkling_kernels.jit_keys import record_keys

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU, real Triton on a GPU
BF16_TOL = 2e-2 if interpreting() else 8e-3


def brute(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().T).to(x.dtype)


def _case(t: int, n: int, k: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * k**-0.5).to(dtype)
    return x, w


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, BF16_TOL)])
@pytest.mark.parametrize("t", [1, 3, MAX_TOKENS])
@pytest.mark.parametrize(
    "n,k,tiles",
    [
        (72, 200, GemvTiles(block_n=32, block_k=64, pre_k=64)),  # N, K past whole tiles; K past PRE_K
        (40, 40, GemvTiles(block_n=16, block_k=64, pre_k=64)),  # K shorter than the tiles
        (48, 136, GemvTiles(block_n=16, block_k=32, pre_k=0)),  # nothing before the wait
        (72, 200, GemvTiles(block_n=64, block_k=64, pre_k=32)),  # a band past N; K past PRE_K
    ],
)
def test_dense_gemv_matches_a_brute_force(dtype, tol, t, n, k, tiles):
    x, w = _case(t, n, k, dtype, seed=t * 1000 + n + k)
    got = dense_gemv(x.to(DEVICE), w.to(DEVICE), tiles).cpu()
    want = brute(x, w)
    assert got.shape == (t, n) and got.dtype == dtype
    scale = want.abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * scale)
    if DEVICE == "cuda":  # and it is what cuBLAS gives, to fp32 summation order
        blas = F.linear(x.to(DEVICE), w.to(DEVICE)).cpu()
        torch.testing.assert_close(got.float(), blas.float(), rtol=tol, atol=tol * scale)


@pytest.mark.skipif(DEVICE != "cuda", reason="the shipped tiles at Inkling's shapes: a GPU's work")
@pytest.mark.parametrize("t", [1, 8, MAX_TOKENS])
@pytest.mark.parametrize("n,k", [(13312, 6144), (11264, 6144), (6144, 8192)])
def test_dense_gemv_at_inkling_shapes(t, n, k):
    """Packed q/k/v/r of a sliding and of a full layer, and the output projection, with the default
    tiles, against float64 and cuBLAS."""
    x, w = _case(t, n, k, torch.bfloat16, seed=n + t)
    xd, wd = x.cuda(), w.cuda()
    got = dense_gemv(xd, wd).float().cpu()
    want = brute(x, w).float()
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=8e-3, atol=8e-3 * scale)
    torch.testing.assert_close(got, F.linear(xd, wd).float().cpu(), rtol=8e-3, atol=8e-3 * scale)


def test_rows_past_the_token_tile_are_refused_and_left_to_linear():
    x, w = (a.to(DEVICE) for a in _case(MAX_TOKENS + 1, 24, 32, torch.float32, seed=1))
    assert not applies(x, w)
    with pytest.raises(ValueError, match="at most 16 rows"):
        dense_gemv(x, w)
    assert not applies(x.t().contiguous().t(), w)  # rows not contiguous
    assert not applies(x[:1], w.to(torch.float64))  # mixed dtypes
    with kernel_dispatch(True), record_keys() as log:
        got = decode_linear(x, w)
    assert not log.launches  # F.linear, not the kernel
    torch.testing.assert_close(got, linear(x, w))


def test_decode_linear_takes_the_gemv_only_where_it_applies():
    x, w = (a.to(DEVICE) for a in _case(2, 24, 32, torch.float32, seed=2))
    for kernels, switch_on, launches in ((True, True, 1), (True, False, 0), (False, True, 0)):
        switch = contextlib.nullcontext() if switch_on else cublas_projections()
        with kernel_dispatch(kernels), switch, record_keys() as log:
            got = decode_linear(x, w)
        assert len(log.launches) == launches, (kernels, switch_on)
        torch.testing.assert_close(got.cpu(), brute(x.cpu(), w.cpu()), rtol=1e-5, atol=1e-6)


def test_every_batch_up_to_the_tile_shares_one_compile():
    # Warm-up decodes at batch 1: serving's decode buckets of 2..16 tokens may need no other variant.
    def keys(t: int) -> set:
        x, w = (a.to(DEVICE) for a in _case(t, 40, 64, torch.bfloat16, seed=t))
        with record_keys() as log:
            dense_gemv(x, w)
        return log.keys()

    one = keys(1)
    assert len(one) == 1
    for t in range(2, MAX_TOKENS + 1):
        assert keys(t) == one, f"batch {t} needs a variant of its own"
