"""Decode output conv + residual add (+ RMSNorm) in one kernel vs the short-conv and add+norm torch
references: outputs and conv state."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.sconv_norm import (  # noqa: E402
    sconv_add_decode,
    sconv_add_rmsnorm_decode,
    sconv_add_rmsnorm_decode_ref,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
CHANNELS = [6144, 1000] if CUDA else [64, 200]  # 200: several chunks and a ragged last one
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}  # bf16: the conv, the add and the norm each round


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [True, False])
def test_matches_reference(c, dtype, norm):
    g = torch.Generator().manual_seed(c + norm)
    bsz, slots = 3, 6
    conv = (0.3 * torch.randn(c, 1, 4, generator=g)).to(DEVICE)
    state = torch.randn(slots, 3, c, generator=g).to(DEVICE)
    rows = torch.tensor([4, 0, 3], device=DEVICE)
    x = (2.0 * torch.randn(bsz, c, generator=g)).to(DEVICE, dtype)
    res = torch.randn(bsz, c, generator=g).to(DEVICE, dtype)
    norm_w = (1.0 + 0.3 * torch.randn(c, generator=g)).to(DEVICE, dtype) if norm else None
    ref_state = state.clone()
    want_n, want_s = sconv_add_rmsnorm_decode_ref(x, conv, ref_state, rows, res, norm_w, 1e-6)
    if norm:
        got_n, got_s = sconv_add_rmsnorm_decode(x, conv, state, rows, res, norm_w, 1e-6)
        torch.testing.assert_close(got_n.float(), want_n.float(), atol=TOL[dtype], rtol=TOL[dtype])
    else:
        got_s = sconv_add_decode(x, conv, state, rows, res)
    torch.testing.assert_close(got_s.float(), want_s.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(state, ref_state, atol=0, rtol=0)  # rows outside the batch untouched too
    # The conv ran: the sum is not the plain residual add.
    assert ((got_s.float() - (res + x).float()).abs().max()) > 0.1
