"""The small-M (decode) path of fused_moe_nvfp4 where the CUDA kernels (moe_w4a16_cuda) are not used: gate/up + SwiGLU and down as row-block GEMVs.

At decode every routed expert gets one or two rows (batch 64, top-6 of 256: ~1.9), so an MMA
padded to 16+ rows wastes most of its work and, worse, every warp re-reads the activation tile
from shared memory. Here each program owns BLOCK_N output columns of one block of at most BM
(token, slot) pairs of one expert (moe_align with block BM) and streams that expert's weight rows
once per block (gemv_steps). Sink experts can be BF16 blocks of MS tokens in the same launches,
first in the grid (tiles.sink_max >= T); by default the caller runs them through the MMA kernels,
which stream them at 3.1 TB/s against 0.7-1.1 TB/s here (H200).

What limits it (H200, inkling-slice, sm_90 SASS): 5.3 instructions per weight at bm 1 (decode 3.25:
nibbles to bf16 bits, a packed FMA by the block scale, widening to fp32; 1 FMA; loads and loop), 7.4
at bm 2, against 4.4 per weight that 4.3 TB/s of 0.5625-byte weights allows; and, at batch 1, too
few bytes in flight: ~600 programs of 2 warps and no software pipelining (each warp waits out the
DRAM latency of every K step), so the routed part streams 1.26 TB/s. Split-K (deterministic, via the
slot sum) and a register prefetch of the next K step are the next steps.

Same buffers as the MMA path: act rows are pairs then sink rows (n_pairs + s * T + t), out is the
per-(token, slot) fp32 buffer that fused_moe_nvfp4's slot sum reduces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_inkling_kernels._triton import interpreting, tl, triton
from sgl_inkling_kernels.gemv_steps import bf16_gemv, nvfp4_gemv
from sgl_inkling_kernels.moe_launch import launch_up_down


@dataclass(frozen=True)
class GemvTiles:
    """bm: pairs per routed block; up_n: intermediate columns per gate/up program (2 * up_n weight
    rows); down_n: hidden rows per down program; kw: code words (8 weights) per row per K step;
    kw_sink: 8-element groups per row per K step of the BF16 sinks; sink_max: largest batch whose
    sinks run here (larger ones go to the MMA kernels)."""

    bm: int = 1
    up_n: int = 32
    down_n: int = 64
    kw: int = 8
    kw_sink: int = 8
    warps: int = 4
    sink_max: int = 0


INTERPRETER_GEMV_TILES = GemvTiles(bm=2, up_n=32, down_n=64, kw=4, kw_sink=2, warps=1, sink_max=4)


@triton.jit
def _store_act(Act, arow, valid, acc, N_INTER, s_at, pid_n, BLOCK_N: tl.constexpr):
    """silu(gate) * up from interleaved accumulator columns (2n gate, 2n + 1 up) into act rows."""
    g, u = tl.split(tl.reshape(acc, (acc.shape[0], BLOCK_N, 2)))
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(Act + arow[:, None] * s_at + cols[None, :], (g * tl.sigmoid(g) * u).to(Act.dtype.element_ty),
             mask=valid[:, None] & (cols < N_INTER)[None, :])  # fmt: skip


@triton.jit
def _up_routed(X, C13, S13, G13, Pairs, BlockExpert, Act, s_xt, s_ce, s_cr, s_se, s_sr, s_at, H, N_INTER,
               num_pairs, r, rows, pid_n, TOPK: tl.constexpr, BM: tl.constexpr, BLOCK_N: tl.constexpr,
               KW: tl.constexpr, ASM: tl.constexpr, HW_FP8: tl.constexpr):  # fmt: skip
    e = tl.load(BlockExpert + r)
    if e >= 0:  # blocks past the last real one (the grid is sized for the worst case) do nothing
        pair = tl.load(Pairs + r * BM + tl.arange(0, BM))
        valid = pair < num_pairs
        tok = tl.where(valid, pair // TOPK, 0)
        e64 = e.to(tl.int64)
        acc = nvfp4_gemv(X + tok[:, None] * s_xt, C13 + e64 * s_ce, S13 + e64 * s_se, rows, s_cr, s_sr, H, KW, ASM,
                         HW_FP8)  # fmt: skip
        acc *= tl.load(G13 + e) * (128.0 if ASM else 1.0)  # scale2 (and the asm decode's 2^-7)
        _store_act(Act, pair, valid, acc, N_INTER, s_at, pid_n, BLOCK_N)


@triton.jit(do_not_specialize=["num_pairs", "T", "n_sink_blocks"])  # batch-dependent ints: no recompiles
def _up_gemv_kernel(
    X, C13, S13, G13, SW13, Pairs, BlockExpert, Act,
    s_xt, s_ce, s_cr, s_se, s_sr, s_we, s_wr, s_at, H, N_INTER, num_pairs, T, n_sink_blocks,
    TOPK: tl.constexpr, BM: tl.constexpr, MS: tl.constexpr, BLOCK_N: tl.constexpr, KW: tl.constexpr,
    KWS: tl.constexpr, ASM: tl.constexpr, HW_FP8: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = tl.minimum(pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N), 2 * N_INTER - 1)  # clamped, not masked
    if MS > 0:
        if pid_m < n_sink_blocks:  # BF16 sink s, tokens (pid_m % tb) * MS ..
            tb = tl.cdiv(T, MS)
            s = pid_m // tb
            tok = (pid_m % tb) * MS + tl.arange(0, MS)
            valid = tok < T
            tok = tl.minimum(tok, T - 1)
            acc = bf16_gemv(X + tok[:, None] * s_xt, SW13 + s * s_we, rows, s_wr, H, KWS)
            _store_act(Act, num_pairs + s * T + tok, valid, acc, N_INTER, s_at, pid_n, BLOCK_N)
        else:
            _up_routed(X, C13, S13, G13, Pairs, BlockExpert, Act, s_xt, s_ce, s_cr, s_se, s_sr, s_at, H, N_INTER,
                       num_pairs, pid_m - n_sink_blocks, rows, pid_n, TOPK, BM, BLOCK_N, KW, ASM, HW_FP8)  # fmt: skip
    else:
        _up_routed(X, C13, S13, G13, Pairs, BlockExpert, Act, s_xt, s_ce, s_cr, s_se, s_sr, s_at, H, N_INTER,
                   num_pairs, pid_m, rows, pid_n, TOPK, BM, BLOCK_N, KW, ASM, HW_FP8)  # fmt: skip


@triton.jit
def _down_routed(Act, C2, S2, G2, Pairs, BlockExpert, Weights, Out, s_at, s_ce, s_cr, s_se, s_sr, s_ot, s_os, H,
                 N_INTER, num_pairs, r, rows, TOPK: tl.constexpr, BM: tl.constexpr, KW: tl.constexpr,
                 ASM: tl.constexpr, HW_FP8: tl.constexpr):  # fmt: skip
    e = tl.load(BlockExpert + r)
    if e >= 0:
        pair = tl.load(Pairs + r * BM + tl.arange(0, BM))
        valid = pair < num_pairs
        arow = tl.where(valid, pair, 0)
        e64 = e.to(tl.int64)
        acc = nvfp4_gemv(Act + arow[:, None] * s_at, C2 + e64 * s_ce, S2 + e64 * s_se, rows, s_cr, s_sr, N_INTER,
                         KW, ASM, HW_FP8)  # fmt: skip
        gate = tl.load(Weights + arow).to(tl.float32) * (tl.load(G2 + e) * (128.0 if ASM else 1.0))
        out = Out + (arow // TOPK)[:, None] * s_ot + (arow % TOPK)[:, None] * s_os + rows[None, :]
        tl.store(out, acc * gate[:, None], mask=valid[:, None])  # clamped rows write the same value twice


@triton.jit(do_not_specialize=["num_pairs", "T", "n_sink_blocks"])  # batch-dependent ints: no recompiles
def _down_gemv_kernel(
    Act, C2, S2, G2, SW2, Pairs, BlockExpert, Weights, SinkWeights, Out,
    s_at, s_ce, s_cr, s_se, s_sr, s_we, s_wr, s_gt, s_ot, s_os, H, N_INTER, num_pairs, T, n_sink_blocks,
    TOPK: tl.constexpr, BM: tl.constexpr, MS: tl.constexpr, BLOCK_N: tl.constexpr, KW: tl.constexpr,
    KWS: tl.constexpr, ASM: tl.constexpr, HW_FP8: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), H - 1)
    if MS > 0:
        if pid_m < n_sink_blocks:
            tb = tl.cdiv(T, MS)
            s = pid_m // tb
            tok = (pid_m % tb) * MS + tl.arange(0, MS)
            valid = tok < T
            tok = tl.minimum(tok, T - 1)
            acc = bf16_gemv(Act + (num_pairs + s * T + tok)[:, None] * s_at, SW2 + s * s_we, rows, s_wr, N_INTER,
                            KWS)  # fmt: skip
            gate = tl.load(SinkWeights + tok * s_gt + s).to(tl.float32)
            out = Out + tok[:, None] * s_ot + (TOPK + s) * s_os + rows[None, :]
            tl.store(out, acc * gate[:, None], mask=valid[:, None])
        else:
            _down_routed(Act, C2, S2, G2, Pairs, BlockExpert, Weights, Out, s_at, s_ce, s_cr, s_se, s_sr, s_ot, s_os,
                         H, N_INTER, num_pairs, pid_m - n_sink_blocks, rows, TOPK, BM, KW, ASM, HW_FP8)  # fmt: skip
    else:
        _down_routed(Act, C2, S2, G2, Pairs, BlockExpert, Weights, Out, s_at, s_ce, s_cr, s_se, s_sr, s_ot, s_os,
                     H, N_INTER, num_pairs, pid_m, rows, TOPK, BM, KW, ASM, HW_FP8)  # fmt: skip


def moe_nvfp4_gemv(x, w13, s13, g13, w2, s2, g2, pairs, block_expert, weights, sw13, sw2, gam, act, out,
                   n_sink: int, tiles: GemvTiles, asm: bool) -> None:  # fmt: skip
    """Fill act and out (fused_moe_nvfp4's buffers) for the routed blocks of moe_align(ids, E, tiles.bm)
    and, when n_sink > 0, for the sinks too. s13 / s2: the block scales viewed as uint8."""
    t, k = weights.shape
    n_pairs = t * k
    h = x.shape[1]
    c13, c2 = w13.view(torch.int32), w2.view(torch.int32)  # 8 codes per word (16 | H and 16 | I)
    ms = triton.next_power_of_2(t) if n_sink else 0
    n_sink_blocks = n_sink * triton.cdiv(t, ms) if n_sink else 0
    if not n_sink:  # stand-ins for absent sinks (never read)
        sw13, sw2, gam = x[:1].view(1, 1, h), x[:1].view(1, h, 1), weights
    blocks = n_sink_blocks + block_expert.shape[0]
    meta = dict(TOPK=k, BM=tiles.bm, MS=ms, KW=tiles.kw, KWS=tiles.kw_sink, ASM=asm, HW_FP8=not interpreting(),
                num_warps=tiles.warps, num_stages=1)  # fmt: skip
    launch_up_down(_up_gemv_kernel, _down_gemv_kernel, x, c13, s13, g13, c2, s2, g2, sw13, sw2, gam, pairs,
                   block_expert, weights, act, out, n_pairs, t, n_sink_blocks, blocks, tiles.up_n, tiles.down_n,
                   meta)  # fmt: skip
