"""The FP8 draft weights' W8A16 GEMV (fp8_gemv.py) and `fp8_linear` against a brute force written
here: the codes decoded by torch's own e4m3 conversion, float64 products over the whole K, the row
scale applied, rounded once. Odd shapes (N past whole row bands, K past whole K steps and shorter than
them), 1, 3, 17 and 64 tokens (one and several token tiles), fp32 (tight) and bf16; above 64 tokens
`fp8_linear` takes the dequantized weight. On a GPU the same cases run in real Triton."""

from __future__ import annotations

import pytest
import torch

from sgl_inkling.layers.linear import fp8_linear, quantize_fp8_rows
from sgl_inkling_kernels._triton import interpreting, kernel_dispatch
from sgl_inkling_kernels.fp8_gemv import MAX_TOKENS, fp8_gemv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16_TOL = 2e-2 if interpreting() else 8e-3


def brute(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    w = codes.cpu().double() * scale.cpu().double()[:, None]
    return (x.cpu().double() @ w.T).to(x.dtype)


def _case(t: int, n: int, k: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g) * k**-0.5 * torch.rand(n, 1, generator=g)  # rows of unlike ranges
    codes, scale = quantize_fp8_rows(w)
    return x, codes, scale


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    top = want.abs().max().item()
    torch.testing.assert_close(got.float().cpu(), want.float(), rtol=tol, atol=tol * top)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, BF16_TOL)])
@pytest.mark.parametrize("t", [1, 3, 17, MAX_TOKENS])
@pytest.mark.parametrize("n,k,block_n", [(72, 200, 32), (40, 40, 16), (100, 136, 64)])
def test_fp8_gemv_matches_a_brute_force(dtype, tol, t, n, k, block_n):
    x, codes, scale = _case(t, n, k, dtype, seed=t * 1000 + n + k)
    got = fp8_gemv(x.to(DEVICE), codes.to(DEVICE), scale.to(DEVICE), block_n=block_n)
    _close(got, brute(x, codes, scale), tol)


@pytest.mark.parametrize("t", [2, MAX_TOKENS + 1])  # the kernel, then the dequantized weight
def test_fp8_linear_takes_either_path_to_the_same_product(t):
    x, codes, scale = _case(t, 48, 96, torch.float32, seed=t)
    with kernel_dispatch(True):
        got = fp8_linear(x.to(DEVICE).view(1, t, 96), codes.to(DEVICE), scale.to(DEVICE))
    assert got.shape == (1, t, 48)
    _close(got[0], brute(x, codes, scale), 1e-5)


def test_fp8_gemv_refuses_what_it_does_not_serve():
    x, codes, scale = _case(MAX_TOKENS + 1, 8, 32, torch.float32, seed=0)
    with pytest.raises(ValueError, match="fp8_gemv"):
        fp8_gemv(x, codes, scale)
    with pytest.raises(ValueError, match="fp8_gemv"):
        fp8_gemv(x[:2], codes, scale.double())
