"""NVFP4 (ModelOpt layout) in plain torch: the reference the fused W4A16 kernel and the loader share.

A quantized weight `W [..., rows, cols]` is stored as
- codes: uint8 `[..., rows, cols / 2]`, two e2m1 codes per byte (element 2j in the low nibble,
  2j + 1 in the high nibble; bit 3 of a code is the sign);
- scale: float8_e4m3fn `[..., rows, cols / 16]`, one scale per 16 consecutive input elements;
- scale2: float32, one per expert (`[E]` for `[E, rows, cols]` weights).
`w = e2m1(code) * float(scale) * scale2`.
"""

from __future__ import annotations

import torch

BLOCK = 16  # input elements per fp8 block scale
FP8_MAX = 448.0
E2M1_MAX = 6.0
# The 8 magnitudes of e2m1 (codes 0-7); codes 8-15 are their negatives.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_table(device: torch.device | str = "cpu") -> torch.Tensor:
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 `[..., n / 2]` -> int64 codes `[..., n]` (low nibble first)."""
    lo = (packed & 0x0F).long()
    hi = (packed >> 4).long()
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def dequantize_nvfp4(
    packed: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """codes `[E, rows, cols/2]`, scale `[E, rows, cols/16]`, scale2 `[E]` -> `[E, rows, cols]` in dtype.

    Computed in fp32: e2m1 * fp8 is exact in fp32, and the product with scale2 rounds once.
    """
    values = e2m1_table(packed.device)[unpack_codes(packed)]
    block = scale.float().repeat_interleave(BLOCK, dim=-1)
    s2 = scale2.float().reshape(scale2.shape + (1,) * (packed.dim() - scale2.dim()))
    return (values * block * s2).to(dtype)
