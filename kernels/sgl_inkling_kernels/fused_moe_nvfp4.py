"""Fused MoE with NVFP4 routed experts (W4A16) and BF16 sink experts, one launch per projection.

The routed experts' packed e2m1 codes and fp8 block scales stream from HBM in the checkpoint's own
layout (or its bits rearranged inside each word, nvfp4_layout's mma layout) and are expanded to bf16
in registers (nvfp4_decode); bf16 MMA with fp32 accumulation, the
per-expert scale2 applied to the accumulator. The sink ("shared") experts are BF16 programs of
the same two launches, placed first in the grid: they are the heaviest programs, so the light
routed ones fill in behind them instead of leaving a tail. Launches: moe_align (routed pairs
sorted by expert, device-only; none when the router made that layout: `alignment`), gate/up +
SwiGLU, down scaled by the routing weight into a per-(token, slot) fp32 buffer, and a slot sum that
skips foreign pairs (experts held by another rank). Every shape depends only on (tokens, top_k, experts): no host sync, CUDA-graph capturable.

The N tile is the grid's fast axis, so batch 1 (6 experts x 1 row) still spreads over every SM.
To read each tile's bytes contiguously the codes of a row are split by nibble: the low nibbles
(elements 2j) multiply the even activations, the high nibbles the odd ones (w4a16_steps).

These MMA kernels serve prefill. On the H200 (Triton 3.6) they stream 1.6 TB/s at batch 1 and
1.0 TB/s at batch 64, bound by the SM's L1/shared-memory pipe, not by DRAM: every warp re-reads the
activation tile for its MMA (ncu_moe_nvfp4_up_bs1.txt). On CUDA GPUs, batches of up to
CUDA_MAX_PAIRS_PER_EXPERT pairs per expert (decode, MTP verify, short extends) take the CUDA W4A16
kernels of moe_w4a16_cuda (2.7 TB/s at batch 1, 2.2 at batch 64 on the H200); elsewhere (the
interpreter, widths not a multiple of 128) decode takes the row-block GEMVs of moe_nvfp4_gemv
(default_tiles), with the sinks in these kernels (benchmark/results/bench_moe_nvfp4_inkling-slice.json).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from sgl_inkling_kernels._triton import dot_mode, interpreting, mm, require_triton, tl, triton
from sgl_inkling_kernels.fused_moe import Alignment, chunk_cap, default_block_m, moe_align, over_token_chunks
from sgl_inkling_kernels.moe_launch import launch_up_down
from sgl_inkling_kernels.moe_nvfp4_gemv import INTERPRETER_GEMV_TILES, GemvTiles, moe_nvfp4_gemv
from sgl_inkling_kernels.moe_slots import UnsummedSlots, sum_slots
from sgl_inkling_kernels.moe_w4a16_cuda import (
    CudaTiles,
    SinksAhead,
    default_cuda_tiles,
    moe_w4a16_decode,
    start_sinks,
    usable,
)
from sgl_inkling_kernels.nvfp4_layout import check_layout
from sgl_inkling_kernels.w4a16_steps import down_step, up_step


@triton.jit
def _rows(pid_m, Pairs, BlockExpert, num_pairs, T, n_sink_blocks, TOPK: tl.constexpr, BLOCK_M: tl.constexpr):
    """(tokens, valid, act rows, routed expert or -1 for a sink block, sink index) of a row block.

    Sink block b covers tokens (b % tb) * BLOCK_M.. of sink b // tb; its act rows follow the pairs'."""
    tb = tl.cdiv(T, BLOCK_M)
    is_sink = pid_m < n_sink_blocks
    r = tl.maximum(pid_m - n_sink_blocks, 0)
    m = tl.arange(0, BLOCK_M)
    s = pid_m // tb
    pair = tl.load(Pairs + r * BLOCK_M + m)
    tok_s = (pid_m % tb) * BLOCK_M + m
    tok = tl.where(is_sink, tok_s, pair // TOPK)
    valid = tl.where(is_sink, tok_s < T, pair < num_pairs)
    arow = tl.where(is_sink, num_pairs + s * T + tok_s, pair)
    e = tl.where(is_sink, -1, tl.load(BlockExpert + r).to(tl.int32))
    return tok, valid, arow, e, s


@triton.jit(do_not_specialize=["num_pairs", "T", "n_sink_blocks"])  # batch-dependent ints: no recompiles
def _up_kernel(
    X, C13, S13, G13, SW13, Pairs, BlockExpert, Act,
    s_xt, s_ce, s_cr, s_se, s_sr, s_we, s_wr, s_at, H, N_INTER, num_pairs, T, n_sink_blocks,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KB: tl.constexpr, BK_S: tl.constexpr,
    ASM: tl.constexpr, HW_FP8: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, MMA: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    tok, valid, arow, e, s = _rows(pid_m, Pairs, BlockExpert, num_pairs, T, n_sink_blocks, TOPK, BLOCK_M)
    if (pid_m >= n_sink_blocks) & (e < 0):
        return  # a routed block past the last real one (the grid is sized for the worst case)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N_INTER
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    x_row = X + tok[:, None] * s_xt
    if e < 0:  # BF16 sink expert s
        offs_k = tl.arange(0, BK_S)
        w_ptr = SW13 + s * s_we + (2 * offs_n)[None, :] * s_wr + offs_k[:, None]  # [K, N] view
        for k0 in range(0, H, BK_S):
            k_ok = offs_k < H - k0
            a = tl.load(x_row + k0 + offs_k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(w_ptr + k0, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            wu = tl.load(w_ptr + k0 + s_wr, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc_g += mm(a, wg, UPCAST, PREC)
            acc_u += mm(a, wu, UPCAST, PREC)
    else:  # NVFP4 routed expert e: gate rows 2n, up rows 2n + 1
        c_ptr = C13 + e.to(tl.int64) * s_ce
        s_ptr = S13 + e.to(tl.int64) * s_se
        full = (H // 2) // KB * KB  # code bytes in whole K steps; the rest is one masked step
        for kb0 in range(0, full, KB):
            acc_g, acc_u = up_step(acc_g, acc_u, x_row, valid, c_ptr, s_ptr, offs_n, n_ok, s_cr, s_sr, kb0, H // 2,
                                    KB, False, ASM, HW_FP8, UPCAST, PREC, MMA)  # fmt: skip
        if full < H // 2:
            acc_g, acc_u = up_step(acc_g, acc_u, x_row, valid, c_ptr, s_ptr, offs_n, n_ok, s_cr, s_sr, full, H // 2,
                                    KB, True, ASM, HW_FP8, UPCAST, PREC, MMA)  # fmt: skip
        post = tl.load(G13 + e) * (128.0 if ASM else 1.0)  # the asm path's 2^-7
        acc_g *= post
        acc_u *= post
    act = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(gate) * up
    tl.store(Act + arow[:, None] * s_at + offs_n[None, :], act.to(Act.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])  # fmt: skip


@triton.jit(do_not_specialize=["num_pairs", "T", "n_sink_blocks"])  # batch-dependent ints: no recompiles
def _down_kernel(
    Act, C2, S2, G2, SW2, Pairs, BlockExpert, Weights, SinkWeights, Out,
    s_at, s_ce, s_cr, s_se, s_sr, s_we, s_wr, s_gt, s_ot, s_os, H, N_INTER, num_pairs, T, n_sink_blocks,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KB: tl.constexpr, BK_S: tl.constexpr,
    ASM: tl.constexpr, HW_FP8: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, MMA: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    tok, valid, arow, e, s = _rows(pid_m, Pairs, BlockExpert, num_pairs, T, n_sink_blocks, TOPK, BLOCK_M)
    if (pid_m >= n_sink_blocks) & (e < 0):
        return
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < H
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    a_row = Act + arow[:, None] * s_at
    if e < 0:
        offs_k = tl.arange(0, BK_S)
        w_ptr = SW2 + s * s_we + offs_n[None, :] * s_wr + offs_k[:, None]  # [K, N] view of [H, I]
        for k0 in range(0, N_INTER, BK_S):
            k_ok = offs_k < N_INTER - k0
            a = tl.load(a_row + k0 + offs_k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + k0, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc += mm(a, w, UPCAST, PREC)
        gate = tl.load(SinkWeights + tok * s_gt + s, mask=valid, other=0.0).to(tl.float32)
        slot = TOPK + s + 0 * tok
    else:
        c_ptr = C2 + e.to(tl.int64) * s_ce
        s_ptr = S2 + e.to(tl.int64) * s_se
        full = (N_INTER // 2) // KB * KB
        for kb0 in range(0, full, KB):
            acc = down_step(acc, a_row, valid, c_ptr, s_ptr, offs_n, n_ok, s_cr, s_sr, kb0, N_INTER // 2, KB, False,
                             ASM, HW_FP8, UPCAST, PREC, MMA)  # fmt: skip
        if full < N_INTER // 2:
            acc = down_step(acc, a_row, valid, c_ptr, s_ptr, offs_n, n_ok, s_cr, s_sr, full, N_INTER // 2, KB, True,
                             ASM, HW_FP8, UPCAST, PREC, MMA)  # fmt: skip
        gate = tl.load(Weights + arow, mask=valid, other=0.0).to(tl.float32)
        gate *= tl.load(G2 + e) * (128.0 if ASM else 1.0)  # the asm path's 2^-7
        slot = arow % TOPK
    out_ptr = Out + tok[:, None] * s_ot + slot[:, None] * s_os + offs_n[None, :]
    tl.store(out_ptr, acc * gate[:, None], mask=valid[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class Tiles:
    """Launch shapes. up_n: intermediate columns per gate/up program (it reads 2 * up_n weight rows);
    down_n: hidden rows per down program; kb: code bytes per row per K step (2 * kb elements);
    bk_sink: elements per K step of the BF16 sinks."""

    up_n: int = 32
    down_n: int = 64
    kb: int = 128
    bk_sink: int = 128
    warps: int = 4
    stages: int = 3


INTERPRETER_TILES = Tiles(up_n=16, down_n=16, kb=16, bk_sink=16, warps=4, stages=1)
GEMV_MAX_PAIRS = 384  # (token, slot) pairs up to which decode takes the GEMVs: measured up to batch 64 at top-6
CUDA_MAX_PAIRS_PER_EXPERT = 64  # mean pairs per expert up to which CUDA GPUs take moe_w4a16_cuda


def default_tiles(n_pairs: int, n_exp: int) -> Tiles | GemvTiles:
    """Decode takes the row-block GEMVs, prefill the MMA kernels. From the H200 measurement at
    inkling-slice shape (benchmark/results/bench_moe_nvfp4_inkling-slice.json): blocks of 1 pair
    while experts rarely get two rows (K steps of 16 words, 2 warps: routed 152 us at batch 1 against
    247 us for the MMA kernels), then blocks of 2 (batch 8: 813 us against 1554 us, batch 64: 4.19 ms
    against 6.80 ms; blocks of 4 take 6.37 ms); the BF16 sinks always in the MMA kernels (GEMV sinks
    reached 0.7-1.1 TB/s, the MMA ones 3.1)."""
    if n_pairs > GEMV_MAX_PAIRS:
        return INTERPRETER_TILES if interpreting() else Tiles()
    if interpreting():
        return replace(INTERPRETER_GEMV_TILES, bm=1 if n_pairs <= 0.1 * n_exp else 2)
    if n_pairs <= 0.1 * n_exp:
        return GemvTiles(bm=1, kw=16, warps=2)
    return GemvTiles(bm=2)


def _check(x, w13, w13_scale, w13_scale2, w2, w2_scale, w2_scale2, shared_w13, shared_w2) -> None:
    require_triton()
    e, two_i, hb = w13.shape
    h, i = 2 * hb, two_i // 2
    want = {
        "w13": (w13, torch.uint8, (e, two_i, hb)),
        "w13_scale": (w13_scale, torch.float8_e4m3fn, (e, two_i, h // 16)),
        "w13_scale2": (w13_scale2, torch.float32, (e,)),
        "w2": (w2, torch.uint8, (e, h, i // 2)),
        "w2_scale": (w2_scale, torch.float8_e4m3fn, (e, h, i // 16)),
        "w2_scale2": (w2_scale2, torch.float32, (e,)),
    }
    if shared_w13 is not None:
        s = shared_w13.shape[0]
        want["shared_w13"] = (shared_w13, x.dtype, (s, two_i, h))
        want["shared_w2"] = (shared_w2, x.dtype, (s, h, i))
    for name, (t, dtype, shape) in want.items():
        if t.dtype != dtype or tuple(t.shape) != shape or t.stride(-1) != 1:
            raise ValueError(f"fused_moe_nvfp4: {name} must be {dtype} {list(shape)} with contiguous rows, "
                             f"got {t.dtype} {list(t.shape)}")  # fmt: skip
    if x.shape[-1] != h or h % 16 or i % 16:
        raise ValueError(f"fused_moe_nvfp4: x is [T, {x.shape[-1]}], experts want hidden {h} (16 | H, 16 | I)")


def fused_moe_nvfp4(
    x: torch.Tensor,  # [T, H] bf16 (fp32 for tests)
    w13: torch.Tensor,  # uint8 [E, 2I, H/2] codes, gate/up rows interleaved
    w13_scale: torch.Tensor,  # float8_e4m3fn [E, 2I, H/16]
    w13_scale2: torch.Tensor,  # fp32 [E]
    w2: torch.Tensor,  # uint8 [E, H, I/2]
    w2_scale: torch.Tensor,  # float8_e4m3fn [E, H, I/16]
    w2_scale2: torch.Tensor,  # fp32 [E]
    ids: torch.Tensor,  # [T, k] int64 local expert ids (E = held by another rank when foreign_ids)
    weights: torch.Tensor,  # [T, k] routing weights
    shared_w13: torch.Tensor | None = None,  # BF16 sinks [S, 2I, H]
    shared_w2: torch.Tensor | None = None,  # [S, H, I]
    shared_weights: torch.Tensor | None = None,  # [T, S] sink gammas
    foreign_ids: bool = False,  # ids may be E; such pairs contribute zero either way (the slot sum skips
    # them, so no zero-filled buffer is needed): the flag states the caller's intent, as in fused_moe
    *,
    max_tokens: int = 4096,
    tiles: Tiles | GemvTiles | CudaTiles | None = None,  # default: CUDA decode kernels, else default_tiles
    asm: bool | None = None,  # bf16 decode in PTX (default on the GPU for bf16 x)
    layout: str = "checkpoint",  # of the codes: "mma" (nvfp4_layout.to_mma_layout) for the CUDA decode kernels
    alignment: Alignment | None = None,  # the router's moe_align of ids, used if for this path's block_m
    sinks_ahead: SinksAhead | None = None,  # the sinks' gate/up launched before routing (sinks_ahead_nvfp4)
    defer_sum: bool = False,  # return the slots (UnsummedSlots) for the next launch to sum, where not chunked
) -> torch.Tensor | UnsummedSlots:
    """fused_moe(x, dequantize_nvfp4(w13..), dequantize_nvfp4(w2..), ids, weights, sinks...) without
    ever materialising the dequantized experts; [T, H] in x's dtype, summed in fp32.

    Long prefills go through in chunks of about `max_tokens` (token_chunks; the per-slot fp32 buffer is
    [T, k + S, H]). The CUDA decode kernels read codes in the mma layout only, the GEMVs in the
    checkpoint's only, the MMA kernels either; by default decode takes the CUDA kernels where the codes
    are in the mma layout and they are usable, else default_tiles (GEMVs only for the checkpoint's)."""
    mma_layout = check_layout(layout) == "mma"
    _check(x, w13, w13_scale, w13_scale2, w2, w2_scale, w2_scale2, shared_w13, shared_w2)
    x = x if x.stride(-1) == 1 else x.contiguous()
    t, k = ids.shape
    if t > chunk_cap(max_tokens):
        if sinks_ahead is not None:
            raise ValueError("fused_moe_nvfp4: sinks_ahead covers one chunk of tokens, not a chunked batch")
        return over_token_chunks(x, ids, weights, shared_weights, max_tokens, lambda xc, ic, wc, sc: fused_moe_nvfp4(
            xc, w13, w13_scale, w13_scale2, w2, w2_scale, w2_scale2, ic, wc, shared_w13, shared_w2, sc, foreign_ids,
            max_tokens=max_tokens, tiles=tiles, asm=asm, layout=layout))  # fmt: skip
    if t == 0:
        return torch.zeros_like(x)
    n_exp, two_i, _ = w13.shape
    h, inter = x.shape[1], two_i // 2
    n_pairs = t * k
    if tiles is None:
        tiles = _cuda_decode_tiles(x, w13, k, mma_layout) or default_tiles(n_pairs, n_exp)
        if mma_layout and isinstance(tiles, GemvTiles):
            tiles = INTERPRETER_TILES if interpreting() else Tiles()
    if sinks_ahead is not None and not isinstance(tiles, CudaTiles):
        raise ValueError("fused_moe_nvfp4: sinks_ahead is for the CUDA decode kernels")
    if isinstance(tiles, CudaTiles) != mma_layout and not isinstance(tiles, Tiles):
        raise ValueError(f"fused_moe_nvfp4: {type(tiles).__name__} read codes in the "
                         f"{'mma' if isinstance(tiles, CudaTiles) else 'checkpoint'} layout, got layout={layout!r}")  # fmt: skip
    use_asm = (not interpreting() and x.dtype == torch.bfloat16) if asm is None else asm
    if use_asm and x.dtype != torch.bfloat16:
        raise ValueError("fused_moe_nvfp4: the asm decode produces bf16 weights, x must be bf16")
    ids = ids.contiguous()
    weights = weights.contiguous()
    n_shared = shared_w13.shape[0] if shared_w13 is not None else 0
    # Sink act rows follow the pairs' (sink s, token t at n_pairs + s * T + t).
    act = torch.empty(n_pairs + n_shared * t, inter, dtype=x.dtype, device=x.device)
    out = torch.empty(t, k + n_shared, h, dtype=torch.float32, device=x.device)  # foreign slots stay unread
    gam = shared_weights.contiguous() if n_shared else None
    s13, s2 = w13_scale.view(torch.uint8), w2_scale.view(torch.uint8)
    if isinstance(tiles, CudaTiles):  # decode on the GPU: the CUDA W4A16 MMA kernels
        moe_w4a16_decode(x, w13, s13, w13_scale2, w2, s2, w2_scale2, ids, weights, shared_w13, shared_w2, gam, act,
                         out, tiles, alignment, sinks_ahead)  # fmt: skip
    elif isinstance(tiles, GemvTiles):  # decode: row-block GEMVs
        pairs, block_expert = moe_align(ids, n_exp, tiles.bm, alignment)
        gemv_sinks = n_shared if t <= tiles.sink_max else 0
        # fp32 activations (x and act): the FMAs take them as they are, with no widening per weight
        act32 = torch.empty(act.shape, dtype=torch.float32, device=x.device) if x.dtype != torch.float32 else act
        moe_nvfp4_gemv(x.float(), w13, s13, w13_scale2, w2, s2, w2_scale2, pairs, block_expert, weights,
                       shared_w13, shared_w2, gam, act32, out, gemv_sinks, tiles, use_asm)  # fmt: skip
        if n_shared and not gemv_sinks:  # the sinks' [T, H] x [H, 2I] is a GEMM: the MMA kernels, sinks only
            pad = pairs if pairs.numel() >= 16 else torch.full((16,), n_pairs, dtype=pairs.dtype, device=x.device)
            _mma(x, w13, s13, w13_scale2, w2, s2, w2_scale2, pad, block_expert, weights, shared_w13, shared_w2,
                 gam, act, out, Tiles() if not interpreting() else INTERPRETER_TILES, 16, use_asm, routed=False)  # fmt: skip
    else:  # prefill: MMA over blocks of 16 or 64 pairs of one expert
        if x.dtype == torch.float32 and not interpreting():  # fp32 (tests): 4-byte tiles must fit shared memory
            tiles = replace(tiles, kb=min(tiles.kb, 32), bk_sink=min(tiles.bk_sink, 64), stages=min(tiles.stages, 2))
        block_m = default_block_m(n_pairs, n_exp)
        pairs, block_expert = moe_align(ids, n_exp, block_m, alignment)
        _mma(x, w13, s13, w13_scale2, w2, s2, w2_scale2, pairs, block_expert, weights, shared_w13, shared_w2, gam,
             act, out, tiles, block_m, use_asm, mma_layout=mma_layout)  # fmt: skip
    slots = UnsummedSlots(out, ids, n_exp, x.dtype)
    return slots if defer_sum else sum_slots(slots)


def _cuda_decode_tiles(x: torch.Tensor, w13: torch.Tensor, top_k: int, mma_layout: bool) -> CudaTiles | None:
    """The CUDA decode kernels' tiles that fused_moe_nvfp4 takes by default for x's tokens, or None: codes
    in the mma layout, at most CUDA_MAX_PAIRS_PER_EXPERT pairs per expert, a GPU and widths they take."""
    t = x.shape[0]
    n_exp, two_i, _ = w13.shape
    n_pairs = t * top_k
    if mma_layout and n_pairs <= CUDA_MAX_PAIRS_PER_EXPERT * n_exp and usable(x, x.shape[1], two_i // 2):
        return default_cuda_tiles(n_pairs, n_exp, t)
    return None


def sinks_ahead_nvfp4(x, w13, shared_w13, top_k: int, layout: str = "checkpoint") -> SinksAhead | None:
    """Launch the sinks' gate/up projection now, before the router, where fused_moe_nvfp4 will run them on
    its side stream (the CUDA decode kernels with tiles.sink_stream): pass the result as its sinks_ahead.
    None (nothing launched) elsewhere. Called before routing, which the sinks' gate/up does not need."""
    if shared_w13 is None or x.shape[0] == 0 or x.shape[0] > chunk_cap(4096):  # fused_moe_nvfp4 chunks past it
        return None
    tiles = _cuda_decode_tiles(x, w13, top_k, check_layout(layout) == "mma")
    if tiles is None or not tiles.sink_stream:
        return None
    return start_sinks(x if x.stride(-1) == 1 else x.contiguous(), shared_w13)


def _mma(x, w13, s13, g13, w2, s2, g2, pairs, block_expert, weights, sw13, sw2, gam, act, out, tiles: Tiles,
         block_m: int, use_asm: bool, routed: bool = True, mma_layout: bool = False) -> None:  # fmt: skip
    """The MMA kernels over the sinks (if any) and (if routed) the blocks of moe_align(ids, E, block_m);
    sinks only, the kernels still read the first block_m pairs and the first block's expert."""
    t, k = weights.shape
    n_pairs = t * k
    h = x.shape[1]
    n_shared = sw13.shape[0] if sw13 is not None else 0
    n_sink_blocks = n_shared * triton.cdiv(t, block_m)
    if not n_shared:
        sw13, sw2, gam = x[:1].view(1, 1, h), x[:1].view(1, h, 1), weights
    upcast, prec = dot_mode(x.dtype)
    blocks = n_sink_blocks + (block_expert.shape[0] if routed else 0)
    meta = dict(TOPK=k, BLOCK_M=block_m, KB=tiles.kb, BK_S=tiles.bk_sink, ASM=use_asm, HW_FP8=not interpreting(),
                UPCAST=upcast, PREC=prec, MMA=mma_layout,
                num_warps=tiles.warps, num_stages=tiles.stages)  # fmt: skip
    launch_up_down(_up_kernel, _down_kernel, x, w13, s13, g13, w2, s2, g2, sw13, sw2, gam, pairs, block_expert,
                   weights, act, out, n_pairs, t, n_sink_blocks, blocks, tiles.up_n, tiles.down_n, meta)  # fmt: skip
