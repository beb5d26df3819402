"""Paged decode attention (Triton) vs the torch reference.

On CPU the kernels run in Triton's interpreter with tiny shapes; on CUDA with Inkling's shapes.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.decode_attention import decode_attention, decode_attention_ref  # noqa: E402

from .paged_case import make_case  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 2e-4, torch.bfloat16: 2e-2}


def _run(case, window, scaling, **kw):
    args = (case.q, case.k_buf, case.v_buf, case.req_to_token, case.rows, case.prefix_lens)
    rest = (case.rel, case.table, case.tau, scaling, window)
    got = decode_attention(*args, *rest, **kw)
    want = decode_attention_ref(*args, *rest)
    return got, want


if CUDA:
    # Inkling full and sliding layers: (heads, kv_heads, dim, d_rel, extent, window)
    SHAPES = [(64, 8, 128, 16, 1024, None), (64, 16, 128, 16, 512, 512)]
    LENS = [[0], [2047], [5, 700, 1500, 3000]]
else:
    SHAPES = [(4, 2, 16, 4, 8, None), (4, 4, 16, 4, 6, 6), (8, 2, 32, 3, 12, 10)]
    LENS = [[0], [37], [3, 20, 41]]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("positions", LENS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("one_new_key", [False, True])
def test_decode_matches_reference(shape, positions, dtype, one_new_key):
    """one_new_key: a decode step's launch, whose first key block loads ahead (PREFETCH) and takes the
    key and value at the query's position afterwards (under the interpreter the same arithmetic)."""
    heads, kv, dim, d_rel, extent, window = shape
    case = make_case(positions, [1] * len(positions), heads, kv, dim, d_rel, extent,
                     with_tau=window is None, dtype=dtype, device=DEVICE, seed=sum(positions))  # fmt: skip
    got, want = _run(case, window, 1.0 / dim**0.5, one_new_key=one_new_key)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("merge_in_kernel", [True, False])
@pytest.mark.parametrize("num_splits", [1, 3, 7, 12])
@pytest.mark.parametrize("one_new_key", [False, True])
def test_decode_split_counts_agree(num_splits, merge_in_kernel, one_new_key):
    """Any split count gives the same answer, including splits that receive no keys, whether the
    last split program of each group merges it or a second launch does (12 splits: more than one
    chunk of the in-kernel merge)."""
    from sgl_inkling_kernels.arrivals import counters

    heads, kv, dim, d_rel, extent, window = SHAPES[0]
    # 191: 192 keys over 12 splits of 16 keys, all used (the merge takes them 8 a step on the CPU)
    positions = [2, 19, 191] if not CUDA else [2, 300, 2500]
    case = make_case(positions, [1] * len(positions), heads, kv, dim, d_rel, extent, True, torch.float32, DEVICE)
    got, want = _run(case, window, 1.0 / dim, num_splits=num_splits, merge_in_kernel=merge_in_kernel, block_n=16,
                     one_new_key=one_new_key)  # fmt: skip
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
    # Every group's counter is back at rest for the next launch (or graph replay).
    assert not counters(case.q.device, len(positions) * kv).any()


@pytest.mark.parametrize("shape", SHAPES)
def test_in_kernel_merge_equals_merge_launch(shape):
    """The last-arrival merge and the separate merge launch combine the same partials: equal
    within fp32 rounding, over a sliding and a full layer's shapes (GQA groups of 2 to 8 heads)."""
    heads, kv, dim, d_rel, extent, window = shape
    positions = [0, 21, 40] if not CUDA else [0, 700, 3000]
    case = make_case(positions, [1] * len(positions), heads, kv, dim, d_rel, extent, window is None, torch.float32,
                     DEVICE, seed=5)  # fmt: skip
    one, _ = _run(case, window, 1.0 / dim**0.5, num_splits=5, block_n=16)
    two, _ = _run(case, window, 1.0 / dim**0.5, num_splits=5, block_n=16, merge_in_kernel=False)
    torch.testing.assert_close(one, two, atol=1e-6, rtol=1e-6)


def test_decode_bias_is_used():
    """Guard against a kernel that drops the relative bias: zeroing the table changes the output."""
    heads, kv, dim, d_rel, extent, window = SHAPES[0]
    case = make_case([9], [1], heads, kv, dim, d_rel, extent, False, torch.float32, DEVICE)
    with_bias, _ = _run(case, window, 1.0 / dim)
    case.table = torch.zeros_like(case.table)
    without, want = _run(case, window, 1.0 / dim)
    torch.testing.assert_close(without, want, atol=2e-4, rtol=2e-4)
    assert (with_bias - without).abs().max() > 1e-3


@pytest.mark.parametrize("context,batch", [(8192, 1), (8192, 2), (131072, 1)])
def test_decode_long_context_split_over_sms(context, batch):
    """8K and 128K contexts with the split count serving picks for an H200 (132 SMs), full-layer
    features (bias extent 1024, log scaling): the splits and their merge equal the reference. Small
    head dims and wide key blocks keep the interpreter fast; one sequence of the batch is short."""
    from sgl_inkling_kernels.decode_attention import default_num_splits

    heads, kv, dim, d_rel, extent = (64, 8, 128, 16, 1024) if CUDA else (4, 2, 16, 4, 1024)
    block_n = 64 if CUDA else 1024
    positions = [context - 1, 300][:batch]
    case = make_case(positions, [1] * batch, heads, kv, dim, d_rel, extent, True, torch.float32, DEVICE, seed=context)
    splits = default_num_splits(batch, kv, context, block_n, 132)
    assert splits > 1
    got, want = _run(case, None, 1.0 / dim, num_splits=splits, block_n=block_n)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("width,rows,prefix", [(1, [3, 0, 5], [7, 0, 2]), (6, [2], [11]), (9, [4, 1, 6], [20, 9, 13])])
def test_equal_extensions_as_decode_queries_without_scans(width, rows, prefix):
    """Every sequence bringing `width` tokens (MTP's verify and draft batches): the broadcast path
    gives the scans' rows and positions exactly, contiguous (the kernel reads them at unit stride)."""
    from sgl_inkling_kernels.decode_attention import extend_as_decode_queries

    r, p = torch.tensor(rows), torch.tensor(prefix)
    lens = torch.full((len(rows),), width)
    want = extend_as_decode_queries(r, p, lens, width * len(rows))
    got = extend_as_decode_queries(r, p, lens, width * len(rows), width=width)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.is_contiguous() and g.tolist() == w.tolist()
