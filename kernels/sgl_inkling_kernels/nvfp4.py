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


# Midpoints between consecutive e2m1 magnitudes: a magnitude above bound k rounds up past code k.
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def round_to_e2m1(q: torch.Tensor) -> torch.Tensor:
    """fp32 values (already divided by their scales) -> int64 e2m1 codes, round to nearest, ties to the
    even code (ModelOpt's cast), magnitudes past 6 clipped to 6; bit 3 carries the sign of negatives."""
    bounds = torch.tensor(_E2M1_BOUNDS, dtype=torch.float32, device=q.device)
    mag = q.abs()
    code = torch.searchsorted(bounds, mag.contiguous())  # first bound >= mag: ties land on the lower code
    at_bound = mag == bounds[code.clamp(max=len(_E2M1_BOUNDS) - 1)]
    code = code + (at_bound & (code % 2 == 1)).long()  # a tie whose lower code is odd goes up to the even one
    return code + 8 * (q < 0).long()


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """int codes `[..., n]` -> uint8 `[..., n / 2]` (element 2j in the low nibble)."""
    pairs = codes.unflatten(-1, (-1, 2))
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[E, rows, cols]` weights -> (codes uint8 `[E, rows, cols/2]`, scale fp8 `[E, rows, cols/16]`,
    scale2 fp32 `[E]`) with ModelOpt's NVFP4 math: scale2 = amax(W_e) / (448 * 6); block scale =
    amax(block) / (6 * scale2) rounded to fp8 e4m3; codes = w / (scale * scale2) rounded onto e2m1."""
    if w.dim() != 3 or w.shape[-1] % BLOCK:
        raise ValueError(f"quantize_nvfp4 needs [E, rows, cols] with cols a multiple of {BLOCK}, got {list(w.shape)}")
    w = w.float()
    amax = w.abs().amax(dim=(1, 2))
    # An all-zero expert has no scale to derive: any positive scale2 encodes it (as zeros).
    scale2 = torch.where(amax > 0, amax / (FP8_MAX * E2M1_MAX), torch.ones_like(amax))
    blocks = w.unflatten(-1, (-1, BLOCK))
    block_amax = blocks.abs().amax(dim=-1)
    scale = (block_amax / (E2M1_MAX * scale2[:, None, None])).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    denom = scale.float()[..., None] * scale2[:, None, None, None]
    q = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, 1.0), 0.0)
    return pack_codes(round_to_e2m1(q).flatten(-2)), scale, scale2
