"""Decode epilogue of the packed q/k/v/r GEMM (q norm, k conv + norm, v conv) vs the torch
references of RMSNorm and the short conv, outputs and conv states."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.qkvr_epilogue import (  # noqa: E402
    qkvr_decode_epilogue,
    qkvr_decode_epilogue_ref,
    qkvr_extend_epilogue,
)
from sgl_inkling_kernels.rmsnorm import rmsnorm_ref  # noqa: E402
from sgl_inkling_kernels.sconv import sconv_ref  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# (heads, kv heads, head dim, d_rel): Inkling's full and sliding layers on CUDA, small dims on CPU
SHAPES = [(64, 8, 128, 16), (64, 16, 128, 16)] if CUDA else [(4, 2, 16, 4), (8, 8, 32, 3)]
# The extend form's walk over a sequence's tokens also at the real sliding layer's heads on the CPU.
EXTEND_SHAPES = SHAPES if CUDA else [*SHAPES, (64, 16, 128, 16)]
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


def _extend_reference(qkvr, nh, nkv, d, q_norm, k_norm, k_conv, v_conv, k_state, v_state, rows, prefix, lens, eps):
    """The extend epilogue composed here from the torch references: per-head norms, the short conv
    over each sequence (zeros before a fresh one)."""
    t, kv = qkvr.shape[0], nkv * d
    q_raw, k_raw, v_raw, r = qkvr.split([nh * d, kv, kv, qkvr.shape[1] - nh * d - 2 * kv], dim=1)
    q = rmsnorm_ref(q_raw.reshape(t, nh, d), q_norm, eps)
    k = rmsnorm_ref(sconv_ref(k_raw, k_conv, k_state, rows, prefix, lens).view(t, nkv, d), k_norm, eps)
    v = sconv_ref(v_raw, v_conv, v_state, rows, prefix, lens).view(t, nkv, d)
    return q, k, v, r.reshape(t, nh, -1)


@pytest.mark.parametrize("shape", EXTEND_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_epilogue_matches_reference_and_captures_windows(shape, dtype):
    """A ragged batch of short extends (3, 1 and 5 tokens; the one-token sequence fresh, its conv from
    zeros whatever its slot holds), k and v into the KV cache at each token's slot, K / V windows
    captured: q / k / v against the composed reference, states exact (they hold the inputs), each
    window as written here from the prior state and the inputs, nothing else written."""
    nh, nkv, d, r = shape
    lens, prefix, rows_l = [3, 1, 5], [7, 0, 2], [4, 0, 3]
    g = torch.Generator().manual_seed(nh + d)
    t, kv, n_rows, n_slots = sum(lens), nkv * d, 6, 20
    qkvr = (3.0 * torch.randn(t, nh * d + 2 * kv + nh * r, generator=g)).to(DEVICE, dtype)
    q_norm, k_norm = (1.0 + 0.3 * torch.randn(2, d, generator=g)).to(DEVICE, dtype)
    k_conv, v_conv = (0.3 * torch.randn(2, kv, 1, 4, generator=g)).to(DEVICE)
    states = torch.randn(2, n_rows, 3, kv, generator=g).to(DEVICE)
    rows, prefix_t, lens_t = (torch.tensor(v, device=DEVICE) for v in (rows_l, prefix, lens))
    slots = torch.randperm(n_slots, generator=g)[:t].to(DEVICE)
    k_buf, v_buf = torch.randn(2, n_slots, nkv, d, generator=g).to(DEVICE, dtype)
    k_before, v_before = k_buf.clone(), v_buf.clone()
    caps = torch.full((2, n_rows, 3 + 6, kv), -7.0, device=DEVICE)
    want_caps = caps.clone()
    at = 0
    for n, p, row in zip(lens, prefix, rows_l):
        for s in range(2):
            want_caps[s, row, :3] = states[s, row] if p > 0 else 0.0
            raw = qkvr[at : at + n, nh * d + s * kv : nh * d + (s + 1) * kv]
            want_caps[s, row, 3 : 3 + n] = raw.float()
        at += n
    ref_states = states.clone()
    args = (nh, nkv, d, q_norm, k_norm, k_conv, v_conv)
    want = _extend_reference(qkvr, *args, ref_states[0], ref_states[1], rows, prefix_t, lens_t, 1e-6)
    q, k, v, rel = qkvr_extend_epilogue(
        qkvr, *args, states[0], states[1], rows, prefix_t, lens_t, torch.cumsum(lens_t, 0) - lens_t, 1e-6,
        kv_cache=(k_buf, v_buf, slots), capture=(caps[0], caps[1]),
    )  # fmt: skip
    assert k is None and v is None
    for got, ref in ((q, want[0]), (k_buf[slots], want[1]), (v_buf[slots], want[2]), (rel, want[3])):
        assert got.shape == ref.shape
        torch.testing.assert_close(got.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(states, ref_states, atol=0, rtol=0)
    torch.testing.assert_close(caps, want_caps, atol=0, rtol=0)
    others = torch.ones(n_slots, dtype=torch.bool, device=DEVICE)
    others[slots] = False
    assert torch.equal(k_buf[others], k_before[others]) and torch.equal(v_buf[others], v_before[others])


def test_extend_epilogue_equals_decode_steps_bit_for_bit():
    """A verify's epilogue equals the decode steps its tokens would have taken one at a time: the same
    bits for q, k, v and the states (what keeps MTP's greedy output the plain decode's on the GPU)."""
    nh, nkv, d, r = SHAPES[1]
    lens = [4, 2, 4]
    g = torch.Generator().manual_seed(23)
    t, kv = sum(lens), nkv * d
    qkvr = (3.0 * torch.randn(t, nh * d + 2 * kv + nh * r, generator=g)).to(DEVICE, torch.bfloat16)
    q_norm, k_norm = (1.0 + 0.3 * torch.randn(2, d, generator=g)).to(DEVICE, torch.bfloat16)
    k_conv, v_conv = (0.3 * torch.randn(2, kv, 1, 4, generator=g)).to(DEVICE)
    states = torch.randn(2, 5, 3, kv, generator=g).to(DEVICE)
    step_states = states.clone()
    rows, lens_t = torch.tensor([1, 4, 2], device=DEVICE), torch.tensor(lens, device=DEVICE)
    args = (nh, nkv, d, q_norm, k_norm, k_conv, v_conv)
    got = qkvr_extend_epilogue(
        qkvr, *args, states[0], states[1], rows, lens_t, lens_t, torch.cumsum(lens_t, 0) - lens_t, 1e-6
    )
    starts = [0, 4, 6]
    for j in range(max(lens)):
        seqs = [i for i, n in enumerate(lens) if n > j]
        at = torch.tensor([starts[i] + j for i in seqs], device=DEVICE)
        step = qkvr_decode_epilogue(qkvr[at], *args, step_states[0], step_states[1], rows[seqs], 1e-6)
        for a, b in zip(got, step):
            assert torch.equal(a[at], b)
    assert torch.equal(states, step_states)
