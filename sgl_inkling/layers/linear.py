"""Linear layers whose per-row results do not depend on how many rows share the call.

On the CPU, GEMM picks a different kernel (and summation order) for very small row counts, so a
token's activations would depend on its batch: a prefix computed inside a long prefill would not
match, bit for bit, the same prefix computed alone. Padding small inputs to _MIN_ROWS rows makes
every row take the same path, which the prefix cache's bitwise-equality guarantee relies on.
CUDA takes the plain path (bitwise batch invariance there is out of scope; greedy tokens agree).
A decode step's projections at a few tokens take `decode_linear`: on the GPU a Triton GEMV that can
launch as a programmatic dependent (sgl_inkling_kernels.dense_gemv), elsewhere `linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sgl_inkling_kernels._triton import use_triton
from sgl_inkling_kernels.dense_gemv import applies, dense_gemv

_MIN_ROWS = 16


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


class Linear(nn.Linear):
    """nn.Linear without bias, computed through `linear` (same parameters, same hub names)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)
