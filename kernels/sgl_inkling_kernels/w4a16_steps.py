"""One K step of the W4A16 products of the NVFP4 MoE: activations split by parity (the low nibble of
code byte j is element 2j, the high nibble element 2j + 1; MMA: codes in nvfp4_layout's mma layout,
decoded to the same split), weight tiles decoded in registers, bf16 (or fp32) dots with fp32 accumulation. Used by fused_moe_nvfp4's gate/up and down kernels.
"""

from __future__ import annotations

from sgl_inkling_kernels._triton import mm, tl, triton
from sgl_inkling_kernels.nvfp4_decode import nvfp4_wtile


@triton.jit
def _split_k(a_ptr, a_ok, kb0, KB_TOT, KB: tl.constexpr, MASK_K: tl.constexpr):
    """Activations of one K step split by parity: (even, odd) [BM, KB]; a_ptr points at element 2 * kb0.
    Loaded contiguously and split in registers."""
    k2 = tl.arange(0, 2 * KB)
    if MASK_K:
        ok = a_ok[:, None] & (2 * kb0 + k2 < 2 * KB_TOT)[None, :]
    else:
        ok = a_ok[:, None] & (k2 < 2 * KB)[None, :]
    a = tl.load(a_ptr + k2[None, :], mask=ok, other=0.0)
    return tl.split(tl.reshape(a, (a.shape[0], KB, 2)))


@triton.jit
def up_step(acc_g, acc_u, x_row, valid, c_ptr, s_ptr, offs_n, n_ok, s_cr, s_sr, kb0, KB_TOT, KB: tl.constexpr,
            MASK_K: tl.constexpr, ASM: tl.constexpr, HW_FP8: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
            MMA: tl.constexpr):  # fmt: skip
    """Gate (rows 2n) and up (rows 2n + 1) accumulators over one K step of an NVFP4 w13."""
    a_even, a_odd = _split_k(x_row + 2 * kb0, valid, kb0, KB_TOT, KB, MASK_K)
    dt = x_row.dtype.element_ty
    g_lo, g_hi = nvfp4_wtile(c_ptr, s_ptr, 2 * offs_n, n_ok, s_cr, s_sr, kb0, KB_TOT, KB, MASK_K, ASM, HW_FP8, dt, MMA)
    acc_g += mm(a_even, g_lo, UPCAST, PREC)
    acc_g += mm(a_odd, g_hi, UPCAST, PREC)
    u_lo, u_hi = nvfp4_wtile(c_ptr, s_ptr, 2 * offs_n + 1, n_ok, s_cr, s_sr, kb0, KB_TOT, KB, MASK_K, ASM, HW_FP8, dt, MMA)
    acc_u += mm(a_even, u_lo, UPCAST, PREC)
    acc_u += mm(a_odd, u_hi, UPCAST, PREC)
    return acc_g, acc_u


@triton.jit
def down_step(acc, a_row, valid, c_ptr, s_ptr, offs_n, n_ok, s_cr, s_sr, kb0, KB_TOT, KB: tl.constexpr,
              MASK_K: tl.constexpr, ASM: tl.constexpr, HW_FP8: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
              MMA: tl.constexpr):  # fmt: skip
    """The down accumulator over one K step of an NVFP4 w2."""
    a_even, a_odd = _split_k(a_row + 2 * kb0, valid, kb0, KB_TOT, KB, MASK_K)
    w_lo, w_hi = nvfp4_wtile(c_ptr, s_ptr, offs_n, n_ok, s_cr, s_sr, kb0, KB_TOT, KB, MASK_K, ASM, HW_FP8,
                             a_row.dtype.element_ty, MMA)  # fmt: skip
    acc += mm(a_even, w_lo, UPCAST, PREC)
    acc += mm(a_odd, w_hi, UPCAST, PREC)
    return acc
