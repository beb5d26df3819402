"""MTP's conv window capture (`_capture`): the batched path of equal-length batches (verify and draft
steps, no host sync) against the per-sequence host loop, bit for bit: a window is the prior state
(zeros without a cached prefix) followed by the stream's inputs, converted to the buffer's dtype."""

import pytest
import torch

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.models.inkling.sconv import _capture

WIDTH, C, TOKENS = 3, 5, 7  # Inkling's kernel of 4; buffers take up to 7 tokens a request


def _same(a, b):
    """Bit for bit (NaNs included)."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def _batch(rows, prefix, n, eq_lens=True):
    lens = [n] * len(rows) if eq_lens else [n] * (len(rows) - 1) + [n - 1]
    fb = ForwardBatch.build(
        ForwardMode.EXTEND, [[0] * k for k in lens], rows, prefix, [0] * sum(lens), [0] * sum(lens), "cpu"
    )
    return fb, sum(lens)


def _reference(x, state, fb, out):
    """The host loop (a batch of unequal lengths takes it)."""
    offset = 0
    for row, p, n in zip(fb.rows_cpu(), fb.prefix_lens_cpu, fb.extend_lens_cpu):
        out[row, :WIDTH] = state[row] if p > 0 else 0
        out[row, WIDTH : WIDTH + n] = x[offset : offset + n].to(out.dtype)
        offset += n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefix", [[10, 0, 7], [4, 9, 2]], ids=["one-fresh", "all-cached"])
def test_batched_capture_equals_the_host_loop(dtype, prefix):
    g = torch.Generator().manual_seed(1)
    rows, n = [5, 1, 3], 4
    fb, t = _batch(rows, prefix, n)
    x = torch.randn(t, C, generator=g).to(dtype)
    state = torch.randn(8, WIDTH, C, generator=g)
    state[1, 0, 0] = float("nan")  # a fresh row's stale state never leaks into its window; a cached one's is copied
    # The buffers are channel slices of a group's buffer (ConvWindows): strided targets.
    group = torch.full((8, WIDTH + TOKENS, 2 * C), -7.0)
    got, want = group[..., C:], group.clone()[..., C:]
    fb.sconv_capture = {0: [got]}
    _capture(x, state, fb, got)
    _reference(x, state, fb, want)
    assert _same(got, want)
    assert torch.equal(group[..., :C], torch.full((8, WIDTH + TOKENS, C), -7.0))  # the other slice untouched
    if min(prefix) > 0:  # a caller that guarantees cached prefixes: no mask, same windows
        again = torch.full_like(group, -7.0)[..., C:]
        fb.sconv_capture, fb.prefixes_cached = {0: [again]}, True
        _capture(x, state, fb, again)
        assert _same(again, want)


def test_state_of_another_dtype_is_converted():
    g = torch.Generator().manual_seed(2)
    fb, t = _batch([2, 0], [3, 0], 2)
    x = torch.randn(t, C, generator=g).to(torch.bfloat16)
    state = torch.randn(4, WIDTH, C, generator=g).to(torch.bfloat16)
    got, want = torch.zeros(4, WIDTH + TOKENS, C), torch.zeros(4, WIDTH + TOKENS, C)
    _capture(x, state, fb, got)
    _reference(x, state, fb, want)
    assert torch.equal(got, want)


def test_unequal_lengths_take_the_host_loop():
    g = torch.Generator().manual_seed(3)
    fb, t = _batch([1, 2], [0, 5], 3, eq_lens=False)
    x = torch.randn(t, C, generator=g)
    state = torch.randn(4, WIDTH, C, generator=g)
    got, want = torch.zeros(4, WIDTH + TOKENS, C), torch.zeros(4, WIDTH + TOKENS, C)
    _capture(x, state, fb, got)
    _reference(x, state, fb, want)
    assert torch.equal(got, want)
