"""Decode epilogue of the packed q/k/v/r GEMM (q norm, k conv + norm, v conv) vs the torch
references of RMSNorm and the short conv, outputs and conv states."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.qkvr_epilogue import qkvr_decode_epilogue, qkvr_decode_epilogue_ref  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# (heads, kv heads, head dim, d_rel): Inkling's full and sliding layers on CUDA, small dims on CPU
SHAPES = [(64, 8, 128, 16), (64, 16, 128, 16)] if CUDA else [(4, 2, 16, 4), (8, 8, 32, 3)]
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}  # bf16: the conv, the norm and the gain each round


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bsz", [1, 5])
def test_epilogue_matches_reference(shape, dtype, bsz):
    nh, nkv, d, r = shape
    g = torch.Generator().manual_seed(nh + nkv + bsz)
    kv = nkv * d
    qkvr = (3.0 * torch.randn(bsz, nh * d + 2 * kv + nh * r, generator=g)).to(DEVICE, dtype)
    q_norm, k_norm = (1.0 + 0.3 * torch.randn(2, d, generator=g)).to(DEVICE, dtype)
    k_conv, v_conv = (0.3 * torch.randn(2, kv, 1, 4, generator=g)).to(DEVICE)
    states = torch.randn(2, bsz + 3, 3, kv, generator=g).to(DEVICE)
    rows = torch.randperm(bsz + 3, generator=g)[:bsz].to(DEVICE)
    ref_states = states.clone()
    args = (nh, nkv, d, q_norm, k_norm, k_conv, v_conv)
    got = qkvr_decode_epilogue(qkvr, *args, states[0], states[1], rows, 1e-6)
    want = qkvr_decode_epilogue_ref(qkvr, *args, ref_states[0], ref_states[1], rows, 1e-6)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(states, ref_states, atol=0, rtol=0)  # rows outside the batch untouched too
    # The conv ran: k before its norm is not the raw projection's normalisation.
    assert (
        got[1].float()
        - torch.nn.functional.rms_norm(qkvr[:, nh * d : nh * d + kv].float().view(bsz, nkv, d), (d,))
        * k_norm.float()
    ).abs().max() > 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_epilogue_stores_kv_into_the_cache(dtype):
    """With the KV buffers and slots, k and v land in the cache rows of the tokens (the same values
    as the plain call returns) and no other cache row changes."""
    nh, nkv, d, r = SHAPES[0]
    bsz, n_slots = 3, 11
    g = torch.Generator().manual_seed(5)
    kv = nkv * d
    qkvr = (3.0 * torch.randn(bsz, nh * d + 2 * kv + nh * r, generator=g)).to(DEVICE, dtype)
    q_norm, k_norm = (1.0 + 0.3 * torch.randn(2, d, generator=g)).to(DEVICE, dtype)
    k_conv, v_conv = (0.3 * torch.randn(2, kv, 1, 4, generator=g)).to(DEVICE)
    states = torch.randn(2, bsz + 1, 3, kv, generator=g).to(DEVICE)
    rows = torch.tensor([2, 0, 3], device=DEVICE)
    slots = torch.tensor([7, 1, 4], device=DEVICE)
    k_buf, v_buf = torch.randn(2, n_slots, nkv, d, generator=g).to(DEVICE, dtype)
    k_before, v_before = k_buf.clone(), v_buf.clone()
    plain_states = states.clone()
    args = (nh, nkv, d, q_norm, k_norm, k_conv, v_conv)
    q, k, v, rel = qkvr_decode_epilogue(qkvr, *args, plain_states[0], plain_states[1], rows, 1e-6)
    got = qkvr_decode_epilogue(qkvr, *args, states[0], states[1], rows, 1e-6, kv_cache=(k_buf, v_buf, slots))
    assert got[1] is None and got[2] is None
    torch.testing.assert_close(got[0], q, atol=0, rtol=0)
    torch.testing.assert_close(states, plain_states, atol=0, rtol=0)
    torch.testing.assert_close(k_buf[slots], k, atol=0, rtol=0)
    torch.testing.assert_close(v_buf[slots], v, atol=0, rtol=0)
    others = torch.ones(n_slots, dtype=torch.bool, device=DEVICE)
    others[slots] = False
    assert torch.equal(k_buf[others], k_before[others]) and torch.equal(v_buf[others], v_before[others])
