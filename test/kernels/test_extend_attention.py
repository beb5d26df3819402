"""Paged extend attention (Triton) vs the torch reference: cold prefill, cached prefixes, ragged batches."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.decode_attention import decode_attention, extend_as_decode_queries  # noqa: E402
from sgl_inkling_kernels.extend_attention import extend_attention, extend_attention_ref  # noqa: E402

from .paged_case import make_case  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 2e-4, torch.bfloat16: 2e-2}

if CUDA:
    SHAPES = [(64, 8, 128, 16, 1024, None), (64, 16, 128, 16, 512, 512)]
    # (prefix_lens, extend_lens)
    BATCHES = [([0], [1500]), ([900], [333]), ([0, 17, 1200], [64, 700, 1]), ([2000, 0], [300, 5])]
else:
    SHAPES = [(4, 2, 16, 4, 8, None), (4, 4, 16, 4, 6, 6), (8, 2, 32, 3, 12, 10)]
    BATCHES = [([0], [23]), ([19], [9]), ([0, 5, 30], [7, 17, 1]), ([12, 0], [3, 2])]


def _run(case, window, scaling, **kw):
    args = (case.q, case.k_buf, case.v_buf, case.req_to_token, case.rows, case.prefix_lens, case.extend_lens)
    rest = (case.rel, case.table, case.tau, scaling, window)
    got = extend_attention(*args, *rest, max_extend_len=int(case.extend_lens.max()), **kw)
    return got, extend_attention_ref(*args, *rest)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("lens", BATCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_matches_reference(shape, lens, dtype):
    heads, kv, dim, d_rel, extent, window = shape
    prefix, ext = lens
    case = make_case(prefix, ext, heads, kv, dim, d_rel, extent, with_tau=window is None, dtype=dtype,
                     device=DEVICE, seed=sum(ext))  # fmt: skip
    got, want = _run(case, window, 1.0 / dim**0.5)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("block_m,block_n", [(1, 16), (4, 32)])
def test_extend_tile_sizes_agree(block_m, block_n):
    heads, kv, dim, d_rel, extent, window = SHAPES[1]
    prefix, ext = BATCHES[2]
    case = make_case(prefix, ext, heads, kv, dim, d_rel, extent, True, torch.float32, DEVICE)
    got, want = _run(case, window, 1.0 / dim, block_m=block_m, block_n=block_n)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("lens", BATCHES + [([40, 3, 77], [9, 9, 9]), ([5, 60], [17, 2])])
def test_short_extend_as_decode_queries_matches_reference(shape, lens):
    """The backend's path for short extensions: one decode query per new token."""
    heads, kv, dim, d_rel, extent, window = shape
    prefix, ext = lens
    case = make_case(prefix, ext, heads, kv, dim, d_rel, extent, with_tau=window is None, dtype=torch.float32,
                     device=DEVICE, seed=3 + sum(ext))  # fmt: skip
    rows, positions = extend_as_decode_queries(case.rows, case.prefix_lens, case.extend_lens, sum(ext))
    assert positions.tolist() == case.positions.tolist()
    rest = (case.rel, case.table, case.tau, 1.0 / dim**0.5, window)
    got = decode_attention(case.q, case.k_buf, case.v_buf, case.req_to_token, rows, positions, *rest)
    want = extend_attention_ref(case.q, case.k_buf, case.v_buf, case.req_to_token, case.rows, case.prefix_lens,
                                case.extend_lens, *rest)  # fmt: skip
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_extend_reads_rows_of_a_broadcast_grid():
    """Lengths that are one row of an expanded [depth, request] grid (stride 0, as the fixed-shape MTP
    draft step passed them) give the reference result: handed to the kernel as is, it read the next
    depth's widths (test_sconv's case of the same H200 failure)."""
    heads, kv, dim, d_rel, extent, window = SHAPES[1]
    case = make_case([40, 3, 77], [9, 9, 9], heads, kv, dim, d_rel, extent, with_tau=False, dtype=torch.float32,
                     device=DEVICE, seed=5)  # fmt: skip
    case.extend_lens = torch.tensor([[9], [12]], device=DEVICE).expand(2, 3)[0]
    assert case.extend_lens.stride(0) == 0
    got, want = _run(case, window, 1.0 / dim**0.5)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
