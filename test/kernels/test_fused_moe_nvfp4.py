"""W4A16 fused MoE (NVFP4 routed experts + BF16 sinks) vs a brute force written here.

The reference decodes the codes with its own table of the 16 e2m1 values and torch's fp8 cast,
then runs every (token, expert) pair in fp32 (fused_moe_ref); no runtime NVFP4 code is involved.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.fused_moe import fused_moe_ref  # noqa: E402
from sgl_inkling_kernels.fused_moe_nvfp4 import Tiles, fused_moe_nvfp4  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

# (experts, sinks, top_k, hidden, intermediate, tokens): odd expert counts, hidden and
# intermediate sizes that are not multiples of the K tile (interpreter: 32 elements).
SHAPES = [(5, 2, 2, 48, 32, 1), (7, 1, 3, 80, 48, 3), (5, 2, 2, 48, 32, 64)]
if CUDA:
    SHAPES += [(8, 2, 6, 6144, 3072, 1), (8, 2, 6, 6144, 3072, 64), (33, 2, 6, 528, 272, 64)]


def decode(codes: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor) -> torch.Tensor:
    """Independent NVFP4 decoder: low nibble = element 2j, high = 2j + 1, value = e2m1 * fp8 * scale2."""
    table = torch.tensor(E2M1, device=codes.device)
    lo, hi = table[(codes & 15).long()], table[(codes >> 4).long()]
    vals = torch.stack([lo, hi], -1).flatten(-2)
    block = scale.float().repeat_interleave(16, dim=-1)
    return vals * block * scale2.float()[:, None, None]


def _quantized(e, rows, cols, gen, gain):
    codes = torch.randint(0, 256, (e, rows, cols // 2), generator=gen, dtype=torch.uint8)
    # Block scales over the fp8 range, subnormals (< 2^-6) included; never zero.
    scale = torch.exp2(torch.empty(e, rows, cols // 16).uniform_(-8.0, 3.0, generator=gen)).to(torch.float8_e4m3fn)
    scale2 = (torch.rand(e, generator=gen) + 0.5) * gain
    return codes.to(DEVICE), scale.to(DEVICE), scale2.to(DEVICE)


def _problem(e, s, k, h, i, t, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(DEVICE, dtype)
    w13 = _quantized(e, 2 * i, h, g, h**-0.5)
    w2 = _quantized(e, h, i, g, i**-0.5)
    sw13 = (torch.randn(s, 2 * i, h, generator=g) * h**-0.5).to(DEVICE, dtype)
    sw2 = (torch.randn(s, h, i, generator=g) * i**-0.5).to(DEVICE, dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(DEVICE)
    weights = (torch.rand(t, k, generator=g) + 0.5).to(DEVICE, dtype)
    gammas = (torch.rand(t, s, generator=g) + 0.5).to(DEVICE, dtype)
    return x, w13, w2, ids, weights, sw13, sw2, gammas


def _reference(x, w13, w2, ids, weights, sw13=None, sw2=None, gam=None):
    f = lambda t: None if t is None else t.float()  # noqa: E731
    return fused_moe_ref(x.float(), decode(*w13), decode(*w2), ids, weights.float(), f(sw13), f(sw2), f(gam))


def _assert_close(got, want, dtype):
    assert got.dtype == dtype and got.shape == want.shape
    err = (got.float() - want).norm() / want.norm()
    assert err < (1e-5 if dtype == torch.float32 else 1e-2), float(err)


ASM = [None, False] if CUDA else [None]  # on the GPU also the portable decode (None: the default)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("asm", ASM)
def test_matches_reference(shape, dtype, asm):
    if asm is False and dtype == torch.float32:
        pytest.skip("fp32 always takes the portable decode")
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(*shape, dtype, seed=sum(shape))
    got = fused_moe_nvfp4(x, *w13, *w2, ids, weights, sw13, sw2, gam, asm=asm)
    _assert_close(got, _reference(x, w13, w2, ids, weights, sw13, sw2, gam), dtype)
    routed = fused_moe_nvfp4(x, *w13, *w2, ids, weights, asm=asm)  # no sinks
    _assert_close(routed, _reference(x, w13, w2, ids, weights), dtype)


@pytest.mark.parametrize("with_sinks", [True, False])
def test_foreign_ids_contribute_zero(with_sinks):
    """Expert parallelism: id E is an expert held by another rank; its pairs add nothing."""
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(7, 2, 3, 48, 32, 5, torch.float32, seed=11)
    foreign = ids % 3 == 0
    sinks = (sw13, sw2, gam) if with_sinks else (None, None, None)
    got = fused_moe_nvfp4(x, *w13, *w2, torch.where(foreign, 7, ids), weights, *sinks, foreign_ids=True)
    want = _reference(x, w13, w2, ids, torch.where(foreign, 0.0, weights), *sinks)
    _assert_close(got, want, torch.float32)


def test_tile_masks_and_token_chunks():
    """N and K tiles that overhang every dimension, and a prefill cut into token chunks."""
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(5, 1, 2, 80, 48, 7, torch.float32, seed=3)
    want = _reference(x, w13, w2, ids, weights, sw13, sw2, gam)
    tiles = Tiles(up_n=32, down_n=32, kb=32, bk_sink=32, warps=4, stages=1)
    _assert_close(fused_moe_nvfp4(x, *w13, *w2, ids, weights, sw13, sw2, gam, tiles=tiles), want, torch.float32)
    _assert_close(fused_moe_nvfp4(x, *w13, *w2, ids, weights, sw13, sw2, gam, max_tokens=3), want, torch.float32)


def test_refuses_wrong_layout_naming_the_tensor():
    x, w13, w2, ids, weights, *_ = _problem(5, 1, 2, 48, 32, 1, torch.float32, seed=4)
    with pytest.raises(ValueError, match="w13_scale"):
        fused_moe_nvfp4(x, w13[0], w13[1].float(), w13[2], *w2, ids, weights)
    with pytest.raises(ValueError, match="w2 "):
        fused_moe_nvfp4(x, *w13, w2[0][:, :, :-1], *w2[1:], ids, weights)
