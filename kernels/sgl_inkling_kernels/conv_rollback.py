"""MTP's conv-state rollback in one launch: state[rows[i], j, c] = window[rows[i], n[i] + j, c] for
j < K-1 over every channel of a run of layers.

After a verify (or a draft step) each layer's short-conv state must go back to just after the n[i]
tokens a request kept, which its captured window holds at rows n[i]..n[i]+K-2 (speculative/
conv_windows.py). Per layer and stream that was a gather and a store: at 66 trunk layers about 330
launches of a few microseconds each a step, latency the draft step's weights do not hide. Here the
windows of a run of layers are channel slices of one buffer, and so are the live states
(SConvStatePool), so the whole run is one [requests, channel blocks] grid reading its bytes once,
with no temporary. The grid depends on shapes only (CUDA-graph safe).
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import interpreting, require_triton, tl, triton, unit_stride


@triton.jit
def _conv_rollback_kernel(
    Window, State, Rows, N,
    stride_wr, stride_wt, stride_sr, stride_sk, C,
    WIDTH: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = offs < C
    row = tl.load(Rows + i).to(tl.int64)
    n = tl.load(N + i).to(tl.int64)
    for j in tl.static_range(WIDTH):
        v = tl.load(Window + row * stride_wr + (n + j) * stride_wt + offs, mask=ok)
        tl.store(State + row * stride_sr + j * stride_sk + offs, v, mask=ok)


def conv_rollback(window: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, n: torch.Tensor) -> None:
    """window [slots, K-1 + tokens, C], state [slots, K-1, C] (fp32, channels at unit stride; channel
    slices of wider buffers are fine); rows, n [B]: state[rows] takes its window's rows n..n+K-2."""
    require_triton()
    slots, width, c = state.shape
    if (window.dim() != 3 or window.shape[0] != slots or window.shape[2] != c or window.shape[1] < width
            or window.dtype != state.dtype or window.stride(2) != 1 or state.stride(2) != 1):  # fmt: skip
        raise ValueError(f"conv rollback: window {tuple(window.shape)} for state {tuple(state.shape)}")
    rows, n = unit_stride(rows, n)
    if rows.shape[0] == 0:
        return
    block_c = 64 if interpreting() else 1024
    _conv_rollback_kernel[(rows.shape[0], triton.cdiv(c, block_c))](
        window, state, rows, n, window.stride(0), window.stride(1), state.stride(0), state.stride(1), c,
        WIDTH=width, BLOCK_C=block_c, num_warps=4,
    )  # fmt: skip
