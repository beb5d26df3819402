"""The keys and values of one block of a sequence's positions, gathered from the paged KV pool
through its req_to_token row: shared by the decode and extend attention kernels."""

from __future__ import annotations

from sgl_inkling_kernels._triton import tl, triton


@triton.jit
def paged_kv_block(K, V, ReqToTok, row, kh, offs_n, n_ok, offs_d, d_ok, stride_ks, stride_kh, stride_vs, stride_vh,
                   stride_rt):  # fmt: skip
    """(k, v) [BLOCK_N, BLOCK_D] of KV head kh at positions offs_n of req_to_token row `row`; zeros
    where n_ok or d_ok is false."""
    slots = tl.load(ReqToTok + row * stride_rt + offs_n, mask=n_ok, other=0)
    k = tl.load(K + slots[:, None] * stride_ks + kh * stride_kh + offs_d[None, :],
                mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    v = tl.load(V + slots[:, None] * stride_vs + kh * stride_vh + offs_d[None, :],
                mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    return k, v
