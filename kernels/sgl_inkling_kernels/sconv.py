"""Fused short convolution: depthwise causal conv + internal residual + state update, in fp32.

y_t = x_t + sum_j w[j] * x_{t-(K-1)+j}, where inputs before the first new token come from the
request's state (its last K-1 inputs) or are zero for a fresh sequence (no cached prefix). After
the call the state holds the last K-1 inputs. Weight [C, 1, K] fp32 (hub layout); state
[slots, K-1, C] fp32, indexed by request row. One launch each for decode and extend; the decode
grid depends on shapes only (CUDA-graph safe, no host sync).
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import interpreting, next_pow2, require_triton, tl, triton, unit_stride


@triton.jit
def _sconv_decode_kernel(
    X, W, State, Rows, Y,
    stride_xb, stride_ss, stride_sk, stride_yb, C,
    K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    row = tl.load(Rows + b)
    offs_k = tl.arange(0, BLOCK_K)
    k_ok = offs_k < K - 1
    st_ptr = State + row * stride_ss + offs_k[:, None] * stride_sk + offs_c[None, :]
    hist = tl.load(st_ptr, mask=k_ok[:, None] & c_ok[None, :], other=0.0)  # [K-1 (padded), C]
    w_hist = tl.load(W + offs_c[None, :] * K + offs_k[:, None], mask=k_ok[:, None] & c_ok[None, :], other=0.0)
    w_last = tl.load(W + offs_c * K + (K - 1), mask=c_ok, other=0.0)
    x = tl.load(X + b * stride_xb + offs_c, mask=c_ok, other=0.0).to(tl.float32)
    y = x + (tl.sum(hist * w_hist, 0) + x * w_last)
    tl.store(Y + b * stride_yb + offs_c, y.to(Y.dtype.element_ty), mask=c_ok)
    # Every thread has read the old state before any thread shifts it.
    tl.debug_barrier()
    tl.store(st_ptr - stride_sk, hist, mask=(k_ok & (offs_k >= 1))[:, None] & c_ok[None, :])
    tl.store(State + row * stride_ss + (K - 2) * stride_sk + offs_c, x, mask=c_ok)


@triton.jit
def _sconv_extend_kernel(
    X, W, State, Rows, PrefixLens, ExtendLens, QStart, Y, Cap,
    stride_xt, stride_ss, stride_sk, stride_yt, stride_cr, stride_ct, C,
    K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    CAPTURE: tl.constexpr = False,
):  # fmt: skip
    b = tl.program_id(0)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    row = tl.load(Rows + b)
    n = tl.load(ExtendLens + b)
    t0 = tl.load(QStart + b)
    # Lowest readable state index: a fresh sequence starts from zeros, whatever its slot holds.
    first_src = tl.where(tl.load(PrefixLens + b) > 0, -(K - 1), 0)
    st_base = State + row * stride_ss
    cap_base = Cap + row * stride_cr
    if CAPTURE:  # the window's first K-1 rows: the prior state (zeros for a fresh sequence)
        offs_p = tl.arange(0, BLOCK_K)
        p_ok = (offs_p < K - 1)[:, None] & c_ok[None, :]
        prior = tl.load(st_base + offs_p[:, None] * stride_sk + offs_c[None, :],
                        mask=p_ok & (offs_p - (K - 1) >= first_src)[:, None], other=0.0)  # fmt: skip
        tl.store(cap_base + offs_p[:, None] * stride_ct + offs_c[None, :], prior.to(Cap.dtype.element_ty), mask=p_ok)

    for i0 in range(0, n, BLOCK_T):
        offs_t = i0 + tl.arange(0, BLOCK_T)
        t_ok = offs_t < n
        acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
        for j in tl.static_range(K - 1):
            src = offs_t - (K - 1) + j  # index into the new tokens; negative = from the state
            m_x = (t_ok & (src >= 0))[:, None] & c_ok[None, :]
            m_s = (t_ok & (src < 0) & (src >= first_src))[:, None] & c_ok[None, :]
            xv = tl.load(X + (t0 + src)[:, None] * stride_xt + offs_c[None, :], mask=m_x, other=0.0)
            sv = tl.load(st_base + (src + K - 1)[:, None] * stride_sk + offs_c[None, :], mask=m_s, other=0.0)
            w = tl.load(W + offs_c * K + j, mask=c_ok, other=0.0)
            acc += (xv.to(tl.float32) + sv) * w[None, :]
        x_cur = tl.load(X + (t0 + offs_t)[:, None] * stride_xt + offs_c[None, :],
                        mask=t_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)  # fmt: skip
        w_last = tl.load(W + offs_c * K + (K - 1), mask=c_ok, other=0.0)
        y = x_cur + (acc + x_cur * w_last[None, :])
        tl.store(Y + (t0 + offs_t)[:, None] * stride_yt + offs_c[None, :], y.to(Y.dtype.element_ty),
                 mask=t_ok[:, None] & c_ok[None, :])  # fmt: skip
        if CAPTURE:  # then the new inputs
            tl.store(cap_base + (K - 1 + offs_t)[:, None] * stride_ct + offs_c[None, :],
                     x_cur.to(Cap.dtype.element_ty), mask=t_ok[:, None] & c_ok[None, :])  # fmt: skip

    # New state: the last K-1 entries of [old state, new inputs].
    offs_k = tl.arange(0, BLOCK_K)
    k_ok = offs_k < K - 1
    src = n + offs_k - (K - 1)
    m_x = (k_ok & (src >= 0))[:, None] & c_ok[None, :]
    m_s = (k_ok & (src < 0) & (src >= first_src))[:, None] & c_ok[None, :]
    xv = tl.load(X + (t0 + src)[:, None] * stride_xt + offs_c[None, :], mask=m_x, other=0.0)
    sv = tl.load(st_base + (src + K - 1)[:, None] * stride_sk + offs_c[None, :], mask=m_s, other=0.0)
    tail = xv.to(tl.float32) + sv
    tl.debug_barrier()  # all reads of the old state happen before it is overwritten
    tl.store(st_base + offs_k[:, None] * stride_sk + offs_c[None, :], tail, mask=k_ok[:, None] & c_ok[None, :])


def _check(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> int:
    require_triton()
    c, one, k = weight.shape
    if one != 1 or x.shape[-1] != c or state.shape[1:] != (k - 1, c) or state.dtype != torch.float32:
        raise ValueError(f"sconv shapes: x {tuple(x.shape)}, weight {tuple(weight.shape)}, state {tuple(state.shape)}")
    if weight.dtype != torch.float32 or not weight.is_contiguous() or state.stride(-1) != 1:
        raise ValueError("sconv: weight must be contiguous fp32 and state rows contiguous")
    return k


def sconv_decode(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """One token per sequence: x [B, C] -> y [B, C] in x's dtype; state[rows] shifted in place."""
    k = _check(x, weight, state)
    x = x if x.stride(-1) == 1 else x.contiguous()
    bsz, c = x.shape
    y = torch.empty_like(x)
    block_c = 64 if interpreting() else 256
    _sconv_decode_kernel[(bsz, triton.cdiv(c, block_c))](
        x, weight, state, rows, y, x.stride(0), state.stride(0), state.stride(1), y.stride(0), c,
        K=k, BLOCK_K=next_pow2(k - 1), BLOCK_C=block_c, num_warps=4,
    )  # fmt: skip
    return y


def sconv_extend(
    x: torch.Tensor,  # [T, C] new tokens, sequence after sequence
    weight: torch.Tensor,
    state: torch.Tensor,
    rows: torch.Tensor,  # [B]
    prefix_lens: torch.Tensor,  # [B] (only > 0 matters: whether the state is live)
    extend_lens: torch.Tensor,  # [B]
    q_start: torch.Tensor | None = None,  # [B] exclusive cumsum of extend_lens
    capture: torch.Tensor | None = None,  # [rows, K-1 + tokens, C]: receives each sequence's window
) -> torch.Tensor:
    """Ragged extend: y [T, C] in x's dtype; each sequence's state updated in place. With `capture`
    (MTP's rollback windows), capture[row] also receives the sequence's window in the same launch:
    its prior state (zeros for a fresh sequence), then its n inputs; the caller sizes it for the
    longest extend."""
    k = _check(x, weight, state)
    x = x if x.stride(-1) == 1 else x.contiguous()
    y = torch.empty_like(x)
    if x.shape[0] == 0:
        return y
    if q_start is None:
        q_start = torch.cumsum(extend_lens, 0) - extend_lens
    rows, prefix_lens, extend_lens, q_start = unit_stride(rows, prefix_lens, extend_lens, q_start)
    c = x.shape[1]
    if capture is not None and (capture.dim() != 3 or capture.shape[1] < k or capture.shape[2] != c
                                or capture.stride(2) != 1):  # fmt: skip
        raise ValueError(f"sconv capture: {tuple(capture.shape)} for {c} channels and a window of {k - 1}")
    cap = capture if capture is not None else y
    block_c = 64 if interpreting() else 128
    block_t = 8 if interpreting() else 32
    _sconv_extend_kernel[(rows.shape[0], triton.cdiv(c, block_c))](
        x, weight, state, rows, prefix_lens, extend_lens, q_start, y, cap,
        x.stride(0), state.stride(0), state.stride(1), y.stride(0),
        cap.stride(0) if capture is not None else 0, cap.stride(1) if capture is not None else 0, c,
        K=k, BLOCK_K=next_pow2(k - 1), BLOCK_T=block_t, BLOCK_C=block_c, CAPTURE=capture is not None, num_warps=4,
    )  # fmt: skip
    return y


def sconv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
) -> torch.Tensor:
    """Torch reference for both modes (decode = every extend_len 1 with a live prefix)."""
    k = weight.shape[-1]
    w = weight.float()[:, 0, :].t()  # [K, C]
    out = torch.empty_like(x)
    offset = 0
    for row, prefix, n in zip(rows.tolist(), prefix_lens.tolist(), extend_lens.tolist()):
        prev = state[row] if prefix > 0 else x.new_zeros(k - 1, x.shape[1], dtype=torch.float32)
        window = torch.cat([prev, x[offset : offset + n].float()], dim=0)  # [n + K - 1, C]
        acc = window[0:n] * w[0]
        for j in range(1, k):
            acc = acc + window[j : j + n] * w[j]
        out[offset : offset + n] = (window[k - 1 :] + acc).to(x.dtype)
        state[row] = window[-(k - 1) :]
        offset += n
    return out
