"""RMSNorm and fused residual-add + RMSNorm, rounded exactly as Inkling's RMSNorm module rounds:
normalise in fp32, cast to the input dtype, then multiply by the gain (a product in the promoted
dtype). With a residual, the sum is rounded to the input dtype first (it is the new hidden state),
and that rounded sum is what gets normalised. One program per row.
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import next_pow2, pdl_launch, pdl_wait, require_triton, tl, triton


@triton.jit
def _rmsnorm_kernel(
    X, Res, W, Out, ResOut,
    stride_x, stride_r, stride_o, stride_ro, N, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(X + row * stride_x + offs, mask=ok, other=0.0)
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(Res + row * stride_r + offs, mask=ok, other=0.0).to(tl.float32)).to(
            X.dtype.element_ty
        )
        tl.store(ResOut + row * stride_ro + offs, x, mask=ok)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / N + eps)
    normed = (xf * inv).to(X.dtype.element_ty).to(tl.float32)
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + offs, (normed * w).to(Out.dtype.element_ty), mask=ok)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    require_triton()
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    res2 = res_out = None
    if residual is not None:
        res2 = residual.reshape(-1, n)
        if res2.stride(-1) != 1:
            res2 = res2.contiguous()
        res_out = torch.empty_like(x2)
    rows = x2.shape[0]
    if rows:
        block = next_pow2(n)
        _rmsnorm_kernel[(rows,)](
            x2, res2 if res2 is not None else x2, weight, out, res_out if res_out is not None else out,
            x2.stride(0), res2.stride(0) if res2 is not None else 0, out.stride(0),
            res_out.stride(0) if res_out is not None else 0, n, float(eps),
            HAS_RES=residual is not None, BLOCK=block, num_warps=min(16, max(1, block // 512)), **pdl_launch(x),
        )  # fmt: skip
    return out.view(x.shape), (res_out.view(x.shape) if res_out is not None else None)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / rms(x)) over the last dim, any leading shape (q/k norms use [T, heads, dim])."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual), x + residual): the normed input of the next block and the new hidden."""
    out, summed = _launch(x, residual, weight, eps)
    return out, summed


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def fused_add_rmsnorm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + residual
    return rmsnorm_ref(summed, weight, eps), summed
