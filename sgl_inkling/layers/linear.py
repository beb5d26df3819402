"""Linear layers whose per-row results do not depend on how many rows share the call.

On the CPU, GEMM picks a different kernel (and summation order) for very small row counts, so a
token's activations would depend on its batch: a prefix computed inside a long prefill would not
match, bit for bit, the same prefix computed alone. Padding small inputs to _MIN_ROWS rows makes
every row take the same path, which the prefix cache's bitwise-equality guarantee relies on.
CUDA takes the plain path (bitwise batch invariance there is out of scope; greedy tokens agree).
A decode step's projections at a few tokens take `decode_linear`: on the GPU a Triton GEMV that can
launch as a programmatic dependent (sgl_inkling_kernels.dense_gemv), elsewhere `linear`.

`Linear.quantize_fp8` (the MTP depths under --speculative-draft-model-quantization fp8) keeps the
weight as fp8 e4m3 codes with one fp32 scale per output row: a few tokens go through a W8A16 GEMV
(sgl_inkling_kernels.fp8_gemv), more (prefill) and the CPU through the dequantized weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sgl_inkling_kernels import fp8_gemv
from sgl_inkling_kernels._triton import use_triton
from sgl_inkling_kernels.dense_gemv import applies, dense_gemv

_MIN_ROWS = 16
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu":
        return F.linear(x, weight)
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n >= _MIN_ROWS:
        return F.linear(x, weight)
    padded = torch.cat([rows, rows.new_zeros(_MIN_ROWS - n, rows.shape[1])])
    return F.linear(padded, weight)[:n].reshape(*x.shape[:-1], weight.shape[0])


def decode_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`linear` for a decode step's rows (x [T, K]): dense_gemv where it applies (kernels on, at most
    dense_gemv.MAX_TOKENS rows), `linear` otherwise."""
    if use_triton(x) and applies(x, weight):
        return dense_gemv(x, weight)
    return linear(x, weight)


def quantize_fp8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (codes float8_e4m3fn [N, K], scale fp32 [N]): a row's scale maps its largest
    magnitude to e4m3's largest (1 for an all-zero row), each code is weight / scale rounded to the
    nearest e4m3 value (computed in fp32)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., K] against fp8 codes [N, K] with row scales [N] -> [..., N] in x's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    if use_triton(x) and fp8_gemv.applies(rows, codes):
        return fp8_gemv.fp8_gemv(rows, codes, scale).reshape(*x.shape[:-1], codes.shape[0])
    # Many tokens (a prefill) or no kernels: the dequantized weight, in x's dtype (e4m3 widens exactly).
    weight = codes.to(x.dtype).mul_(scale[:, None].to(x.dtype))
    return linear(x, weight)


class Linear(nn.Linear):
    """nn.Linear without bias, computed through `linear` (same parameters, same hub names)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def quantize_fp8(self) -> None:
        """Keep the weight as fp8 codes (the `weight` parameter, same shape) and a `weight_scale` buffer
        (quantize_fp8_rows); after loading: the loaders write the checkpoint's BF16. Once: codes stay."""
        if self.weight.dtype == FP8:
            return
        codes, scale = quantize_fp8_rows(self.weight)
        self.weight = nn.Parameter(codes, requires_grad=False)
        self.register_buffer("weight_scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype == FP8:
            return fp8_linear(x, self.weight, self.weight_scale)
        return linear(x, self.weight)
