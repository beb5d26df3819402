"""RMSNorm as Inkling computes it: normalise in fp32, cast back, then scale by the learned gain."""

from __future__ import annotations

import torch
from torch import nn

from sgl_inkling_kernels._triton import use_triton
from sgl_inkling_kernels.rmsnorm import rmsnorm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):
            return rmsnorm(x, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)
