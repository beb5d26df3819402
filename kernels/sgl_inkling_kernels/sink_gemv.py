"""The BF16 sink experts of a decode batch (at most 64 tokens) in two Triton launches, the same results
as `moe_w4a16_cuda.sinks_blas` (rounded at the same points):

    h[s, t, r] = x[t] . W13[s, r]                      gate rows r = 2j, up rows 2j + 1 (interleaved)
    act[s, t, j] = silu(h[s, t, 2j]) * h[s, t, 2j+1]   rounded to x's dtype, as the torch ops round
    out[t, topk + s, :] = gam[t, s] * (act[s, t] @ W2[s]^T)

Why: at batch 1 the sinks are 54% of the fused NVFP4 MoE's bytes, and cuBLAS streams them at 72% of
4.3 TB/s at best (benchmark/bench_sink_gemms.py, H200) in five launches (the gate/up GEMM, the
activation, the down bmm, the weighting and the copy). Here each program streams a band of weight
rows over the whole K with the batch's tokens as a 16-row MMA operand, the activation is the
gate/up launch's epilogue and the weighting the down launch's. H200 at 1b494e6, alone: 58.4 / 59.5 /
60.3 / 76.5 / 76.2 us at 1 / 8 / 16 / 32 / 64 tokens (3.88 TB/s, 90% of 4.3, at batch 1) against
cuBLAS's 72.8 / 78.0 / 78.3 / 80.8 / 83.5 us, so the fused MoE's default, where it runs beside the
routed kernels with 3 stages (moe_w4a16_cuda.SinkPlan). Grids depend on shapes only (CUDA-graph safe).

Compile variants: T is not specialised (do_not_specialize), so a launch's Triton variant follows
BLOCK_T alone, the batch rounded up to 16, 32 or 64 (WARMUP_TOKENS meets each once); the pipeline's
stages are cut to what the token and weight tiles leave of shared memory.
"""

from __future__ import annotations

import torch

from sgl_inkling_kernels._triton import dot_mode, interpreting, mm, next_pow2, require_triton, tl, triton

MAX_TOKENS = 64
WARMUP_TOKENS = (1, 32, MAX_TOKENS)  # one batch per token tile (16, 32, 64): every variant serving meets
SMEM_BYTES = 220 * 1024  # of the H200's 227 KB a block may use, less Triton's own scratch


@triton.jit
def _band_dot(A, stride_a, W, stride_w, offs_t, t_ok, offs_r, r_ok, K,
              BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
              PREC: tl.constexpr):  # fmt: skip
    """[BLOCK_T, BLOCK_R] fp32: rows offs_t of A times weight rows offs_r of W, over all K."""
    acc = tl.zeros([BLOCK_T, BLOCK_R], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        a = tl.load(A + offs_t[:, None] * stride_a + offs_k[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + offs_r[:, None] * stride_w + offs_k[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        acc += mm(a, tl.trans(w), UPCAST, PREC)
    return acc


@triton.jit(do_not_specialize=["T"])
def _sink_up_kernel(
    X, W13, Act, T, K, INTER,
    stride_xt, stride_ws, stride_wr, stride_as, stride_at,
    BLOCK_T: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0)
    jb = tl.program_id(1)
    offs_t = tl.arange(0, BLOCK_T)
    offs_r = jb * 2 * BLOCK_J + tl.arange(0, 2 * BLOCK_J)  # gate/up rows, interleaved as stored
    t_ok = offs_t < T
    r_ok = offs_r < 2 * INTER
    acc = _band_dot(X, stride_xt, W13 + s * stride_ws, stride_wr, offs_t, t_ok, offs_r, r_ok, K,
                    BLOCK_T, 2 * BLOCK_J, BLOCK_K, UPCAST, PREC)  # fmt: skip
    dt = Act.dtype.element_ty
    gate, up = tl.split(tl.reshape(acc.to(dt).to(tl.float32), [BLOCK_T, BLOCK_J, 2]))
    silu = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
    act = (silu * up).to(dt)
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    tl.store(Act + s * stride_as + offs_t[:, None] * stride_at + offs_j[None, :], act,
             mask=t_ok[:, None] & (offs_j < INTER)[None, :])  # fmt: skip


@triton.jit(do_not_specialize=["T"])
def _sink_down_kernel(
    Act, W2, Gam, Out, T, K, H, topk,
    stride_as, stride_at, stride_ws, stride_wr, stride_gt, stride_gs, stride_ot, stride_oe,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0)
    nb = tl.program_id(1)
    offs_t = tl.arange(0, BLOCK_T)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    t_ok = offs_t < T
    n_ok = offs_n < H
    acc = _band_dot(Act + s * stride_as, stride_at, W2 + s * stride_ws, stride_wr, offs_t, t_ok, offs_n, n_ok, K,
                    BLOCK_T, BLOCK_N, BLOCK_K, UPCAST, PREC)  # fmt: skip
    y = acc.to(Act.dtype.element_ty).to(tl.float32)
    gam = tl.load(Gam + offs_t * stride_gt + s * stride_gs, mask=t_ok, other=0.0).to(tl.float32)
    tl.store(Out + offs_t[:, None] * stride_ot + (topk + s) * stride_oe + offs_n[None, :],
             (y * gam[:, None]).to(Out.dtype.element_ty), mask=t_ok[:, None] & n_ok[None, :])  # fmt: skip


def sinks_gemv(x, sw13, sw2, gam, out, topk: int, block_j: int = 16, block_n: int = 32, block_k: int = 256,
               num_stages: int = 4) -> None:  # fmt: skip
    """out[:, topk + s] = gam[:, s] * sink_s(x) for a batch of at most MAX_TOKENS tokens: x [T, H],
    sw13 [S, 2I, H] (gate/up rows interleaved), sw2 [S, H, I], gam [T, S], out [T, topk + S, H]."""
    act = sinks_gemv_up(x, sw13, block_j, block_k, num_stages)
    sinks_gemv_down(act, sw2, gam, out, topk, block_n, block_k, num_stages)


def _launch_shape(t: int, block_rows: int, block_k: int, num_stages: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(block_t, block_k, num_stages) of a launch over t tokens and weight tiles of block_rows rows."""
    block_t = max(16, next_pow2(t))  # tl.dot takes at least 16 rows
    if interpreting():
        block_k = min(block_k, 64)
    # Each stage holds a token tile and a weight tile of block_k columns; 64 tokens with 64-row tiles
    # at 4 stages would ask for 256 KB.
    per_stage = (block_t + block_rows) * block_k * dtype.itemsize
    return block_t, block_k, max(1, min(num_stages, SMEM_BYTES // per_stage))


def sinks_gemv_up(x, sw13, block_j: int = 16, block_k: int = 256, num_stages: int = 4) -> torch.Tensor:
    """The sinks' gate/up GEMV and SwiGLU: act [S, T, I] for x [T, H] (at most MAX_TOKENS tokens) and sw13
    [S, 2I, H]. It needs no routing: the fused MoE launches it ahead of the router (moe_w4a16_cuda.start_sinks)."""
    require_triton()
    t, h = x.shape
    n_sinks, two_i, _ = sw13.shape
    inter = two_i // 2
    if not 0 < t <= MAX_TOKENS or sw13.shape[2] != h:
        raise ValueError(f"sinks_gemv: x {tuple(x.shape)}, sw13 {tuple(sw13.shape)} (at most {MAX_TOKENS} tokens)")
    if x.stride(1) != 1 or sw13.stride(2) != 1:
        raise ValueError("sinks_gemv: rows of x and the weights must be contiguous")
    block_t, block_k, num_stages = _launch_shape(t, 2 * block_j, block_k, num_stages, x.dtype)
    upcast, prec = dot_mode(x.dtype)
    act = torch.empty(n_sinks, t, inter, dtype=x.dtype, device=x.device)
    _sink_up_kernel[(n_sinks, triton.cdiv(inter, block_j))](
        x, sw13, act, t, h, inter,
        x.stride(0), sw13.stride(0), sw13.stride(1), act.stride(0), act.stride(1),
        BLOCK_T=block_t, BLOCK_J=block_j, BLOCK_K=block_k, UPCAST=upcast, PREC=prec, num_warps=4,
        num_stages=num_stages,
    )  # fmt: skip
    return act


def sinks_gemv_down(act, sw2, gam, out, topk: int, block_n: int = 32, block_k: int = 256, num_stages: int = 4) -> None:
    """out[:, topk + s] = gam[:, s] * (sw2[s] @ act[s]) for act [S, T, I] (sinks_gemv_up's), sw2 [S, H, I],
    gam [T, S], out [T, topk + S, H]."""
    n_sinks, t, inter = act.shape
    h = sw2.shape[1]
    if sw2.shape != (n_sinks, h, inter) or gam.shape != (t, n_sinks) or out.shape[0] != t or out.shape[2] != h:
        raise ValueError(f"sinks_gemv: act {tuple(act.shape)}, sw2 {tuple(sw2.shape)}, gam {tuple(gam.shape)}, "
                         f"out {tuple(out.shape)}")  # fmt: skip
    if sw2.stride(2) != 1 or out.stride(2) != 1:
        raise ValueError("sinks_gemv: rows of the weights and out must be contiguous")
    block_t, block_k, num_stages = _launch_shape(t, block_n, block_k, num_stages, act.dtype)
    upcast, prec = dot_mode(act.dtype)
    _sink_down_kernel[(n_sinks, triton.cdiv(h, block_n))](
        act, sw2, gam, out, t, inter, h, topk,
        act.stride(0), act.stride(1), sw2.stride(0), sw2.stride(1), gam.stride(0), gam.stride(1), out.stride(0),
        out.stride(1),
        BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=upcast, PREC=prec, num_warps=4,
        num_stages=num_stages,
    )  # fmt: skip
