"""MTP's one-launch conv-state rollback (conv_rollback, and ConvWindows.restore on it) against a
per-element loop written here: the state of each request row becomes its captured window's rows
n..n+K-2, over every channel of the run of layers, and nothing else in the state buffer moves."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling.mem_cache.memory_pool import SConvStatePool  # noqa: E402
from sgl_inkling.speculative.conv_windows import ConvWindows  # noqa: E402
from sgl_inkling_kernels._triton import kernel_dispatch  # noqa: E402
from sgl_inkling_kernels.conv_rollback import conv_rollback  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _expected(window: torch.Tensor, state: torch.Tensor, rows: list[int], n: list[int]) -> torch.Tensor:
    want = state.clone()
    for r, k in zip(rows, n):
        for j in range(state.shape[1]):
            for c in range(state.shape[2]):
                want[r, j, c] = window[r, k + j, c]
    return want


@pytest.mark.parametrize("channels", [1, 70, 130])
def test_rollback_of_channel_slices_of_wider_buffers(channels):
    """Window and state as channel slices at odd offsets of wider buffers (how the pool and the
    capture lay out a run of layers): only the slice of the rolled-back rows changes."""
    g = torch.Generator().manual_seed(channels)
    wide_window = torch.randn(6, 3 + 9, channels + 11, generator=g).to(DEVICE)
    wide_state = torch.randn(6, 3, channels + 7, generator=g).to(DEVICE)
    window, state = wide_window[..., 5 : 5 + channels], wide_state[..., 3 : 3 + channels]
    rows, n = [4, 0, 2], [1, 9, 5]
    want = wide_state.clone()
    want[..., 3 : 3 + channels] = _expected(window, state, rows, n)
    conv_rollback(window, state, torch.tensor(rows, device=DEVICE), torch.tensor(n, device=DEVICE))
    assert torch.equal(wide_state, want)


def test_rollback_reads_rows_of_a_broadcast_grid():
    """Rows and counts handed as rows of expanded grids (stride 0) still read element by element."""
    window = torch.randn(4, 8, 20).to(DEVICE)
    state = torch.randn(4, 3, 20).to(DEVICE)
    want = _expected(window, state, [2, 2], [3, 3])
    grid_rows = torch.tensor([2], device=DEVICE).expand(3, 2)
    grid_n = torch.tensor([3], device=DEVICE).expand(3, 2)
    conv_rollback(window, state, grid_rows[1], grid_n[1])
    assert torch.equal(state, want)


def test_conv_windows_restore_on_the_kernel_equals_the_torch_path():
    """ConvWindows over a pool of 5 layers of 4 streams: the trunk as one group and the last two
    layers as another, rolled back whole and by a run of layers (what a tail's step restores),
    give the same states on the kernel and on the torch path, equal to the loop's."""
    chans = {i: (4 + i, 4 + i, 12, 12) for i in range(5)}
    states = []
    for kernels in (True, False):
        torch.manual_seed(0)
        pool = SConvStatePool(5, chans, 4, DEVICE)
        trunk, depths = ConvWindows(pool, [[0, 1, 2]], 4), ConvWindows(pool, [[3, 4]], 7)
        pool.buffer.normal_()
        for caps in (trunk, depths):
            for buf, _ in caps.groups:
                buf.normal_()
        want = pool.buffer.clone()
        rows, n = torch.tensor([3, 1], device=DEVICE), torch.tensor([2, 4], device=DEVICE)
        for caps, layers in ((trunk, None), (depths, range(4, 5))):
            for layer in layers or caps:
                for state, window in zip(pool.states[layer], caps[layer]):
                    lo = state.storage_offset()
                    want[..., lo : lo + state.shape[-1]] = _expected(window, state, [3, 1], [2, 4])
        with kernel_dispatch(kernels):
            trunk.restore(rows, n)
            depths.restore(rows, n, range(4, 5))
        assert torch.equal(pool.buffer, want)
        states.append(pool.buffer)
    assert torch.equal(*states)


def test_conv_windows_refuse_layers_apart_in_the_pool():
    pool = SConvStatePool(3, {0: (4, 4, 8, 8), 1: (4, 4, 8, 8), 2: (4, 4, 8, 8)}, 4, DEVICE)
    with pytest.raises(ValueError, match="not consecutive"):
        ConvWindows(pool, [[0, 2]], 4)
