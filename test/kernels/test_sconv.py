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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefix_lens,extend_lens", [([5, 0, 9], [1, 2, 20]), ([3, 7, 4], [9, 9, 9])])
def test_sconv_extend_captures_windows(dtype, prefix_lens, extend_lens):
    """With `capture` (MTP's rollback windows) the extend also writes, per sequence, its prior state
    (zeros for a fresh sequence) then its inputs into capture[row]: a channel slice of a wider fp32
    buffer, as speculative/conv_windows.py hands it; other rows, channels and the columns past the
    window are untouched, and the outputs and state equal the plain extend's."""
    c, k, wide, tokens = CHANNELS[-1], 4, CHANNELS[-1] + 24, 24
    g, weight, state = _setup(c, k, 5, 11)
    rows = torch.tensor([2, 0, 4], device=DEVICE)
    prefix = torch.tensor(prefix_lens, device=DEVICE)
    ext = torch.tensor(extend_lens, device=DEVICE)
    x = torch.randn(sum(extend_lens), c, generator=g).to(DEVICE, dtype)
    buf = torch.randn(6, k - 1 + tokens, wide, generator=g).to(DEVICE)
    before, prior = buf.clone(), state.clone()
    plain_state = state.clone()
    want_y = sconv_extend(x, weight, plain_state, rows, prefix, ext)
    got_y = sconv_extend(x, weight, state, rows, prefix, ext, capture=buf[..., 8 : 8 + c])
    torch.testing.assert_close(got_y, want_y, atol=0, rtol=0)
    torch.testing.assert_close(state, plain_state, atol=0, rtol=0)
    want = before.clone()
    offset = 0
    for row, p, n in zip(rows.tolist(), prefix_lens, extend_lens):
        want[row, : k - 1, 8 : 8 + c] = prior[row] if p > 0 else 0.0
        want[row, k - 1 : k - 1 + n, 8 : 8 + c] = x[offset : offset + n].float()
        offset += n
    torch.testing.assert_close(buf, want, atol=0, rtol=0)


@pytest.mark.parametrize("extend_lens", [[9, 9, 9], [1, 4, 20]])
def test_short_conv_capture_kernel_equals_torch_capture(extend_lens):
    """The model's ShortConv on an MTP batch (sconv_capture set): the Triton path, whose extend kernel
    writes the windows, leaves the same windows, states and outputs as the torch path's `_capture`
    plus reference conv, in every stream's slice of ConvWindows' shared buffer."""
    from sgl_inkling.mem_cache.memory_pool import SConvStatePool
    from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
    from sgl_inkling.models.inkling.sconv import ShortConv
    from sgl_inkling.speculative.conv_windows import ConvWindows
    from sgl_inkling_kernels._triton import kernel_dispatch

    c, k, layer = CHANNELS[-1], 4, 3
    g = torch.Generator().manual_seed(5)
    chans = (c, 48, c + 16, 32)
    convs = [ShortConv(ch, k, layer, s).to(DEVICE) for s, ch in enumerate(chans)]
    for conv in convs:
        conv.weight.data = (0.3 * torch.randn(conv.weight.shape, generator=g)).to(DEVICE)
    rows, prefix = [2, 0, 4], [5, 0, 3]
    xs = [torch.randn(sum(extend_lens), ch, generator=g).to(DEVICE, torch.bfloat16) for ch in chans]
    states0 = [torch.randn(6, k - 1, ch, generator=g).to(DEVICE) for ch in chans]

    def run(kernels: bool):
        pool = SConvStatePool(6, {layer: chans}, k, DEVICE)
        for st, s0 in zip(pool.states[layer], states0):
            st.copy_(s0)
        windows = ConvWindows(pool, [[layer]], max(extend_lens))
        windows.groups[0][0].fill_(7.0)  # stale values a capture must overwrite (or leave, past the window)
        batch = ForwardBatch.build(ForwardMode.EXTEND, [[0] * n for n in extend_lens], rows, prefix,
                                   [0] * sum(extend_lens), [0] * sum(extend_lens), torch.device(DEVICE))  # fmt: skip
        batch.sconv_pool, batch.sconv_capture = pool, windows
        with kernel_dispatch(kernels):
            ys = [conv(x, batch) for conv, x in zip(convs, xs)]
        return ys, pool.states[layer], windows.groups[0][0]

    ys, states, buf = run(True)
    ys_ref, states_ref, buf_ref = run(False)
    torch.testing.assert_close(buf, buf_ref, atol=0, rtol=0)
    for y, y_ref, st, st_ref in zip(ys, ys_ref, states, states_ref):
        torch.testing.assert_close(y.float(), y_ref.float(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(st, st_ref, atol=1e-6, rtol=0)


def test_sconv_extend_reads_rows_of_a_broadcast_grid():
    """Per-sequence lengths that are one row of an expanded [depth, request] grid (stride 0: how the
    fixed-shape MTP draft step hands each depth its widths) give the reference result. The kernel
    reads element i at base + i, so such a row handed over as is gave it the next depths' widths,
    and past the grid's end an illegal address (the draft graphs' capture at batch 2 and up on the H200)."""
    c, k = CHANNELS[-1], 4
    g, weight, state = _setup(c, k, 5, 3)
    rows = torch.tensor([2, 0, 4], device=DEVICE)
    widths = torch.tensor([[9], [12]], device=DEVICE).expand(2, 3)  # depth 0 takes 9 tokens a request, depth 1 12
    prefix = torch.tensor([[6], [5]], device=DEVICE).expand(2, 3)
    for d in range(2):
        ext, pre = widths[d], prefix[d]
        assert ext.stride(0) == 0 and ext.tolist() == [ext[0].item()] * 3
        x = torch.randn(3 * int(ext[0]), c, generator=g).to(DEVICE)
        st_ref = state.clone()
        want = sconv_ref(x, weight, st_ref, rows, pre, ext)
        got = sconv_extend(x, weight, state, rows, pre, ext)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state, st_ref, atol=1e-6, rtol=0)
