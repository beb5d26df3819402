"""Fused short conv (decode and extend) vs the torch reference, outputs and state updates."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.sconv import sconv_decode, sconv_extend, sconv_ref  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
CHANNELS = [6144, 1024, 100] if CUDA else [64, 100]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _setup(c: int, k: int, n_rows: int, dtype_seed: int):
    g = torch.Generator().manual_seed(dtype_seed)
    weight = (0.3 * torch.randn(c, 1, k, generator=g)).to(DEVICE)
    state = torch.randn(n_rows, k - 1, c, generator=g).to(DEVICE)
    return g, weight, state


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("k", [4, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sconv_decode(c, k, dtype):
    g, weight, state = _setup(c, k, 6, c + k)
    rows = torch.tensor([4, 1, 3], device=DEVICE)
    x = torch.randn(3, c, generator=g).to(DEVICE, dtype)
    st_ref = state.clone()
    want = sconv_ref(x, weight, st_ref, rows, torch.ones_like(rows), torch.ones_like(rows))
    got = sconv_decode(x, weight, state, rows)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(state, st_ref, atol=0, rtol=0)  # rows not in the batch untouched too


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("k", [4, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "prefix_lens,extend_lens",
    [([0], [37]), ([5, 0, 9], [1, 2, 20]), ([3, 7], [2, 70])],
)
def test_sconv_extend(c, k, dtype, prefix_lens, extend_lens):
    g, weight, state = _setup(c, k, 5, c + k + len(prefix_lens))
    rows = torch.tensor([2, 0, 4][: len(prefix_lens)], device=DEVICE)
    prefix = torch.tensor(prefix_lens, device=DEVICE)
    ext = torch.tensor(extend_lens, device=DEVICE)
    x = torch.randn(sum(extend_lens), c, generator=g).to(DEVICE, dtype)
    st_ref = state.clone()
    want = sconv_ref(x, weight, st_ref, rows, prefix, ext)
    got = sconv_extend(x, weight, state, rows, prefix, ext)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(state, st_ref, atol=1e-6, rtol=0)


def test_sconv_decode_continues_extend():
    """Prefill then decode steps equal one long prefill (the state carries the window)."""
    c, k = CHANNELS[-1], 4
    g, weight, state = _setup(c, k, 2, 7)
    rows = torch.tensor([1], device=DEVICE)
    x = torch.randn(12, c, generator=g).to(DEVICE)
    one = torch.ones(1, dtype=torch.int64, device=DEVICE)
    full = sconv_extend(x, weight, state.clone(), rows, 0 * one, 12 * one)
    parts = [sconv_extend(x[:9], weight, state, rows, 0 * one, 9 * one)]
    parts += [sconv_decode(x[i : i + 1], weight, state, rows) for i in range(9, 12)]
    torch.testing.assert_close(torch.cat(parts), full, atol=1e-6, rtol=0)
