"""The two launches (gate/up + SwiGLU, then down) that every Triton NVFP4 MoE path makes.

The MMA kernels (fused_moe_nvfp4) and the row-block GEMVs (moe_nvfp4_gemv) take the same buffers in
the same order: x, codes, block scales, scale2, BF16 sinks, pairs, block experts and act for gate/up;
act, codes, scales, scale2, sinks, pairs, block experts, routing and sink weights and the slot
buffer for down. Only the kernels, the codes' view (bytes or int32 words) and the meta-parameters
differ.
"""

from __future__ import annotations

from sgl_inkling_kernels._triton import triton


def launch_up_down(up_kernel, down_kernel, x, c13, s13, g13, c2, s2, g2, sw13, sw2, gam, pairs, block_expert,
                   weights, act, out, n_pairs: int, t: int, n_sink_blocks: int, blocks: int, up_n: int,
                   down_n: int, meta: dict) -> None:  # fmt: skip
    """Gate/up over ceil(I / up_n) x blocks programs, then down over ceil(H / down_n) x blocks."""
    h, inter = x.shape[1], c13.shape[1] // 2
    up_kernel[(triton.cdiv(inter, up_n), blocks)](
        x, c13, s13, g13, sw13, pairs, block_expert, act,
        x.stride(0), c13.stride(0), c13.stride(1), s13.stride(0), s13.stride(1), sw13.stride(0), sw13.stride(1),
        act.stride(0), h, inter, n_pairs, t, n_sink_blocks, BLOCK_N=up_n, **meta,
    )  # fmt: skip
    down_kernel[(triton.cdiv(h, down_n), blocks)](
        act, c2, s2, g2, sw2, pairs, block_expert, weights, gam, out,
        act.stride(0), c2.stride(0), c2.stride(1), s2.stride(0), s2.stride(1), sw2.stride(0), sw2.stride(1),
        gam.stride(0), out.stride(0), out.stride(1), h, inter, n_pairs, t, n_sink_blocks, BLOCK_N=down_n, **meta,
    )  # fmt: skip
