"""The sinks' Triton GEMVs (sink_gemv.py) against a brute force written here: float64 products,
rounded to the activation dtype where the torch path rounds (gate/up, silu, their product, the down
projection), then weighted in fp32. Odd shapes: I not a multiple of the row band, H not a multiple
of the down block, K not a multiple of the K tile; batches 1, 3 and 64; fp32 (tight: layout and
semantics) and bf16 (Triton's interpreter casts fp32 to bf16 by truncation where the GPU rounds to
nearest, so on the CPU the bf16 bound allows four truncations)."""

from __future__ import annotations

import pytest
import torch

from sgl_inkling_kernels._triton import interpreting
from sgl_inkling_kernels.jit_keys import record_keys
from sgl_inkling_kernels.moe_w4a16_cuda import sinks_blas
from sgl_inkling_kernels.sink_gemv import MAX_TOKENS, WARMUP_TOKENS, sinks_gemv


def brute(x, sw13, sw2, gam, topk: int, out_shape) -> torch.Tensor:
    dt = x.dtype
    out = torch.full(out_shape, float("nan"))
    for s in range(sw13.shape[0]):
        h = (x.double() @ sw13[s].double().T).to(dt).float()  # [T, 2I]
        act = (torch.nn.functional.silu(h[:, 0::2]).to(dt).float() * h[:, 1::2]).to(dt)
        y = (act.double() @ sw2[s].double().T).to(dt).float()
        out[:, topk + s] = y * gam[:, s].float()[:, None]
    return out


BF16_TOL = 6e-2 if interpreting() else 1.6e-2
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU, real Triton on a GPU


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, BF16_TOL)])
@pytest.mark.parametrize("t", [1, 3, MAX_TOKENS])
def test_sinks_gemv_matches_a_brute_force(dtype, tol, t):
    g = torch.Generator().manual_seed(40 + t)
    topk, s, h, i = 3, 2, 96 + 40, 24 + 5  # H = 136: not a multiple of 32 or 64; I = 29: of 16
    x = torch.randn(t, h, generator=g).to(dtype)
    sw13 = (torch.randn(s, 2 * i, h, generator=g) * h**-0.5).to(dtype)
    sw2 = (torch.randn(s, h, i, generator=g) * i**-0.5).to(dtype)
    gam = (torch.rand(t, s, generator=g) + 0.5).to(dtype)
    out = torch.full((t, topk + s, h), float("nan"), device=DEVICE)
    sinks_gemv(*(a.to(DEVICE) for a in (x, sw13, sw2, gam)), out, topk, block_k=64)
    out = out.cpu()
    want = brute(x, sw13, sw2, gam, topk, out.shape)
    assert out[:, :topk].isnan().all()  # routed slots are not its business
    scale = want[:, topk:].abs().max().item()
    torch.testing.assert_close(out[:, topk:], want[:, topk:], rtol=tol, atol=tol * scale)
    if dtype == torch.float32:  # and it is the cuBLAS path's result
        ref = torch.full_like(out, float("nan"))
        sinks_blas(x, sw13, sw2, gam, ref, topk)
        # Two fp32 summation orders (and the CPU BLAS's depends on its thread count, so on the load):
        # an absolute bound relative to the outputs' scale, as above; 1e-6 flat failed once at 1.2e-6.
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * scale, equal_nan=True)


def test_sinks_gemv_refuses_what_it_cannot_hold():
    x = torch.randn(MAX_TOKENS + 1, 32)
    sw13, sw2 = torch.randn(2, 16, 32), torch.randn(2, 32, 8)
    with pytest.raises(ValueError, match="at most 64 tokens"):
        sinks_gemv(x, sw13, sw2, torch.rand(MAX_TOKENS + 1, 2), torch.empty(MAX_TOKENS + 1, 5, 32), 3)


def _keys(t: int, h: int = 128, i: int = 64) -> set:
    """The compile keys of one sinks_gemv call at batch t (Triton's own rules: jit_keys)."""
    g = torch.Generator().manual_seed(t)
    x = torch.randn(t, h, generator=g, dtype=torch.bfloat16)
    sw13 = torch.randn(2, 2 * i, h, generator=g, dtype=torch.bfloat16)
    sw2 = torch.randn(2, h, i, generator=g, dtype=torch.bfloat16)
    with record_keys() as log:
        sinks_gemv(x, sw13, sw2, torch.rand(t, 2, dtype=torch.bfloat16), torch.empty(t, 8, h), 6)
    return log.keys()


def test_warmup_batches_compile_every_variant_a_batch_can_meet():
    # What kernel_warmup runs through the CUDA MoE on the GPU: after it, no batch of 1..64 tokens
    # (decode buckets, short extends, MTP verify widths) may need a compile of its own. Two
    # variants per warm-up batch (gate/up and down), each a different token tile.
    warm = set().union(*(_keys(t) for t in WARMUP_TOKENS))
    assert len(warm) == 2 * len(WARMUP_TOKENS)
    for t in (2, 3, 15, 16, 17, 24, 31, 33, 48, 63):
        assert _keys(t) <= warm, f"batch {t} needs a variant warm-up did not compile"
