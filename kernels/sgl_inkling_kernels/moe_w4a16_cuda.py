"""The decode path of fused_moe_nvfp4 on NVIDIA GPUs: W4A16 tensor-core projections in CUDA C++.

csrc/moe_w4a16_mma.cu says why and how (mma.sync fragments decoded from code words in
nvfp4_layout's mma layout, the checkpoint's bits rearranged once at load). It is built with nvcc
on first use (cuda_build: seconds, cached per machine) and
called through ctypes on torch's current stream, so it is captured by CUDA graphs like any
kernel. It runs blocks of 8 * nt (token, slot) pairs of one expert; at small batches the BF16 sink
experts are blocks of the same kernel (one block per sink; in a launch of their own when
split_sinks), above that they go through cuBLAS. Prefill (many pairs per expert) stays with the
Triton MMA kernels.

Buffers are fused_moe_nvfp4's: act rows (pairs, then sink s token t at n_pairs + s * T + t) and the
[T, k + S, H] fp32 slot buffer that its slot sum reduces.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from sgl_inkling_kernels._triton import pdl_launch
from sgl_inkling_kernels.cuda_build import load_cuda_library
from sgl_inkling_kernels.fused_moe import Alignment, moe_align
from sgl_inkling_kernels.sink_gemv import MAX_TOKENS as GEMV_MAX_TOKENS
from sgl_inkling_kernels.sink_gemv import sinks_gemv_down, sinks_gemv_up

SRC = Path(__file__).with_name("csrc") / "moe_w4a16_mma.cu"
CHUNK = 128  # K elements per chunk of the kernel: H and I must be multiples of it
MAX_SINK_TOKENS = 64  # one sink block holds at most 8 * 8 tokens


@dataclass(frozen=True)
class CudaTiles:
    """nt: 8-column MMA tiles per block (a block is 8 * nt pairs of one expert); depth: K chunks of
    code loads in flight per warp (2, 4 or 8); kernel_sink_max: largest batch whose BF16 sinks run in
    the same launches (one block of at most 64 tokens per sink), larger ones go to cuBLAS. Build
    choices (one library per combination): l2, the L2 prefetch span of the weight loads in bytes
    (0, 128 or 256); warps per CTA (they split K); dual_acc, two mma chains per chunk; x_prefetch,
    the next chunk's activations loaded while one computes (one column tile); cp_async, stages of a
    shared-memory ring for the code stream instead of registers (0: registers, depth applies);
    split_sinks, sink and routed blocks in separate launches (each kernel with only its path's
    registers); one_launch_max, the largest batch that default_cuda_tiles gives one launch for sinks
    and routed blocks whatever split_sinks says; sink_stream, the BF16 sinks through cuBLAS on a side
    stream at every batch, concurrent with the routed launches (kernel_sink_max is then unused); pdl,
    up to this many tokens (0: never; any other value builds it in) the down launch as a programmatic
    dependent launch that starts streaming its weights while the gate/up launch finishes (Hopper); row_ring, stages of a per-warp shared-memory ring whose copies
    cover whole 128-byte row spans (two chunks a stage) in place of the cp.async chunk ring and the
    register ring (0: off, cp_async and depth then pick between those two). The row ring copies 8-byte
    scale segments: scale tensors without 8-byte aligned rows take the chunk ring (ring_for); lean, the
    row ring's loop for one column tile with every lane's addresses set once (csrc row_ring_lean);
    row_tiles, 16-row tiles a CTA of the routed launches, like nt the batch's choice (default_cuda_tiles):
    1, or 2 sharing each chunk's activation loads (csrc tile_pair: one column tile, the lean row ring)."""

    nt: int = 1
    depth: int = 4
    kernel_sink_max: int = 8
    l2: int = 256
    warps: int = 2  # H200 at b6a5ab8 with lean and a 3-stage row ring: 2 warps a CTA 118.9 / 489.3 / 2331 us
    # at batch 1 / 8 / 64, 1 warp 126.1 / 490.3 / 2342, 4 warps (367a5c6) 121.3 / 519.9 / 2490: a warp's loop
    # over half of K amortises its prologue and the partial-tile reduction (results/diagnostics/moe_lean_b6a5ab8)
    dual_acc: int = 1
    x_prefetch: int = 0
    cp_async: int = 8  # H200 sweep at 554ba14: the ring with split launches is fastest summed over
    split_sinks: int = 1  # batch 1, 8, 64, but one launch is 9% faster at batch 1 (153 us against 169)
    one_launch_max: int = 1  # and 4% slower at batch 8: one launch up to batch 1
    # H200 at 9d18659: the sinks on a side stream beat every in-kernel choice at batch 1 and 8 (146.6
    # and 603.5 us against 150.8 and 619.9 for the one-launch / split default) and tie at 64.
    sink_stream: int = 1
    # H200 at 07e7170 with the Triton decode kernels launched as programmatic dependents (pdl_launch),
    # trunk layer ms from CUDA graphs: pdl at every batch 0.1979-0.1992 / 0.5352 / 1.9926 at batch 1 / 8 /
    # 64 against 0.1997-0.2010 / 0.5344 / 1.9357 without (results/diagnostics/pdl_07e7170): on up to 8.
    pdl: int = 8
    # H200 at 057268b, routed only, us at batch 1 / 8 / 64: the two launches 99 / 535 / 2550, one resident
    # wave of CTAs streaming their tiles back to back (that commit's `persist`) 105 / 621 / 2815, and both
    # projections in one launch fed by a work queue (its `fused`) 112 / 637 / 3142: short CTAs win (both
    # removed since).
    # H200 at e5dd617, fused MoE (routed) us at batch 1 / 8 / 64: chunk ring 147.7 (99.5) / 600.2 (536.5) /
    # 2567 (2476); row ring of 4 stages 145.4 (90.4) / 555.0 (485.4) / 2416 (2307); 3 and 5 stages slower.
    # At f49cebb its odd-chunk form (half last stage, 8-byte scale copies) passed every GPU case, 148.3 /
    # 597.3 / 2557 against the chunk ring's 147.9 / 600.1 / 2594: the default since. The chunk ring
    # (row_ring=0, cp_async above) stays as the fallback. A ring of the same stages filled by bulk copies
    # (cp.async.bulk, mbarriers) was slower there, 185 / 900 / 3919 us with 4 stages, and was removed.
    # With lean (below) fewer stages in flight are faster: at b6a5ab8 (2 warps) 3 stages 118.9 / 489.3 / 2331 us,
    # 2 stages 123.2 / 489.3 / 2344, 4 stages 120.6 / 492.6 / 2379 (4 warps at 367a5c6: 3 stages 121.3 / 519.9 /
    # 2490, 4 stages 125.3 / 540.7 / 2598, 5 stages 127.9 / 577.8 / 2654).
    row_ring: int = 3
    # lean: the row ring's loop for one column tile (every decode batch) with its addresses hoisted
    # (csrc row_ring_lean): the same copies and products in about 455 instructions a stage against 599.
    # The default since b6a5ab8 (with 2 warps and 3 stages, above): the fused MoE at 118.9 / 489.3 / 2331 us
    # at batch 1 / 8 / 64 against 131.4 / 564.5 / 2593 for the build before it (4 warps, 4 stages, no lean).
    lean: int = 1
    row_tiles: int = 1
    # What limits the row ring (Nsight Compute at f93a6c1, results/ncu_moe_w4a16_bs64_e256.txt: the up launch
    # at batch 64 over 256 experts, the steady state): instruction issue, not memory. Issue slots 75.7% busy
    # (3.04 IPC), the ALU pipe (LOP3 / PRMT of the decode) 64.7%, DRAM 58%; 4.57 instructions per routed
    # weight (about 250 a 128-element chunk in the loop: 112 decode, 32 bf16 scale products, 16 B-fragment
    # PRMTs, 8 HMMA, the rest addresses, scale conversion and the ring). So the kernel needs fewer
    # instructions per weight, not more bytes in flight: at 62db06d the next chunk's activations loaded
    # ahead (two register sets, 122 registers), a register bound of 5 or 6 CTAs an SM (91 / 80 registers)
    # and a 3-stage ring with 6 CTAs all measured equal or slower, 129.3-137.8 / 562.9-615.1 / 2585-2869 us
    # at batch 1 / 8 / 64 against 130.7 / 562.9 / 2585 (removed since); at f93a6c1 pdl, one mma chain,
    # 128-byte L2 prefetch and 2-warp CTAs were within 2% (results/diagnostics/moe_issue_bound_62db06d).
    # With lean the routed launches at batch 64 are no longer bound by issue (Nsight Compute at 957bcda,
    # results/diagnostics/moe_x_ahead_7f29064: 58% of issue slots, 2.7 instructions a weight, DRAM 75%, L2 92%;
    # a third of the stall samples wait on each stage's activation loads). Loading them a chunk of products
    # ahead in the lean loop (same 96 registers) measured 113.0 / 440.5 / 2093.1 us at batch 1 / 8 / 64 against
    # 113.0 / 417.8 / 2092.7 at 7f29064 and was removed again; reading fewer distinct activation rows (a padding
    # column takes its block's first row, csrc start_tile) gained 4%.

    @property
    def block_m(self) -> int:
        """(token, slot) pairs of one expert per block: 8 a column tile."""
        return 8 * self.nt

    def __post_init__(self):
        if self.lean not in (0, 1):
            raise ValueError(f"CudaTiles: lean is 0 or 1, got {self.lean}")
        if self.x_prefetch and self.cp_async:
            raise ValueError("CudaTiles: x_prefetch is for the register ring, not with cp_async")
        if self.row_tiles not in (1, 2):
            raise ValueError(f"CudaTiles: row_tiles is 1 or 2, got {self.row_tiles}")
        if self.row_tiles == 2 and not (self.nt == 1 and self.row_ring and self.lean):
            raise ValueError("CudaTiles: row_tiles 2 needs nt 1, the row ring and lean")

    def defines(self) -> tuple[tuple[str, int], ...]:
        names = ("MOE_L2_PREFETCH", "MOE_WARPS", "MOE_DUAL_ACC", "MOE_X_PREFETCH", "MOE_CP_ASYNC", "MOE_SPLIT_SINKS",
                 "MOE_PDL", "MOE_ROW_RING", "MOE_LEAN")  # fmt: skip
        values = (self.l2, self.warps, self.dual_acc, self.x_prefetch, self.cp_async, self.split_sinks, int(self.pdl > 0),
                  self.row_ring, self.lean)  # fmt: skip
        return tuple(zip(names, values))


BUILD = CudaTiles()  # the depth, sink and build choices of the default tiles (nt comes from the batch)

_I, _L, _P = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
_ARGS = [_I] * 6 + [_P, _L, _P, _L, _L, _P, _L, _L, _P, _P, _L, _L, _P, _P, _P, _P, _L, _P, _L, _P, _L, _L] + [_I] * 7 + [_P]


@functools.cache
def _library(defines: tuple[tuple[str, int], ...] = CudaTiles().defines()) -> ctypes.CDLL:
    lib = load_cuda_library(SRC, dict(defines))
    lib.sgl_moe_w4a16.argtypes = _ARGS
    lib.sgl_moe_w4a16.restype = ctypes.c_int
    lib.sgl_moe_w4a16_error.argtypes = [ctypes.c_int]
    lib.sgl_moe_w4a16_error.restype = ctypes.c_char_p
    return lib


def _launch(lib, up: bool, nt: int, rt: int, depth: int, block_lo: int, n_blocks: int, src, codes, scales, scale2,
            sink, pairs, block_expert, w32, g32, act, out, n_pairs: int, t: int, k: int, n_sink_blocks: int,
            pdl: bool) -> None:  # fmt: skip
    """One projection (see sgl_moe_w4a16 in the source); strides of the uint8 codes/scales in bytes."""
    if src.stride(1) != 1 or src.stride(0) % 8 or src.data_ptr() % 16:
        raise ValueError("moe_w4a16: activations must be bf16 rows starting on 16-byte boundaries")
    has_sink = sink.numel() > 0
    rc = lib.sgl_moe_w4a16(
        int(up), nt, rt, depth, block_lo, n_blocks, src.data_ptr(), src.stride(0),
        codes.data_ptr(), codes.stride(0), codes.stride(1), scales.data_ptr(), scales.stride(0), scales.stride(1),
        scale2.data_ptr(), sink.data_ptr() if has_sink else None, sink.stride(0) if has_sink else 0,
        sink.stride(1) if has_sink else 0, pairs.data_ptr(), block_expert.data_ptr(), w32.data_ptr(),
        g32.data_ptr() if g32.numel() else None, g32.stride(0) if g32.numel() else 0,
        act.data_ptr(), act.stride(0), out.data_ptr(), out.stride(0), out.stride(1),
        codes.shape[1], src.shape[1], n_pairs, t, k, n_sink_blocks, int(pdl),
        torch.cuda.current_stream(src.device).cuda_stream,
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"moe_w4a16 launch failed: {lib.sgl_moe_w4a16_error(rc).decode()}")


@functools.cache
def _has_bf16_mma(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 0)


def usable(x: torch.Tensor, hidden: int, inter: int) -> bool:
    """The kernels need a CUDA bf16 x, mma.sync bf16 (sm_80+) and H, I multiples of 128."""
    return x.is_cuda and x.dtype == torch.bfloat16 and hidden % CHUNK == 0 and inter % CHUNK == 0 \
        and _has_bf16_mma(x.device)  # fmt: skip


def default_cuda_tiles(n_pairs: int, n_exp: int, tokens: int) -> CudaTiles:
    """Columns per block from the mean pairs per expert (blocks padded to 8 * nt cost MMA work and
    activation loads, never weight bytes, which each block reads once); sinks and routed blocks in
    one launch up to BUILD.one_launch_max tokens when the sinks run in the kernels at all (with
    sink_stream no sink block is launched, so the split would only build a second, identical library)."""
    mean = n_pairs / max(n_exp, 1)  # H200, inkling-slice: nt 1 is best up to a mean of 6, nt 4 at 24
    nt = 1 if mean <= 8 else 2 if mean <= 16 else 4 if mean <= 40 else 8
    one_launch = tokens <= BUILD.one_launch_max and not BUILD.sink_stream
    split = 0 if one_launch else BUILD.split_sinks
    pair_rows = nt == 1 and BUILD.row_ring and BUILD.lean and min(n_pairs, n_exp) >= ROW_TILE_PAIR_MIN_BLOCKS
    return replace(BUILD, nt=nt, split_sinks=split, row_tiles=2 if pair_rows else 1)


# Routed blocks (about the distinct experts a batch hits) from which a CTA takes two row tiles: half the
# CTAs, so a batch needs enough of them to fill the GPU's waves. Measured on the H100 (bench_moe_nvfp4,
# switches_62faac1): 2 tiles take the fused MoE from 2388 to 2359 us at batch 64 (256 blocks) but from
# 563 to 569 us at batch 8 (48 blocks), and 153 to 159 us at batch 1.
ROW_TILE_PAIR_MIN_BLOCKS = 128


def cuda_block_m(n_pairs: int, n_exp: int, tokens: int) -> int:
    """The block size of the pairs' layout (moe_align) that the decode kernels take for this batch by
    default: the model has the router make that layout ahead (route_decode_aligned)."""
    return default_cuda_tiles(n_pairs, n_exp, tokens).block_m


def sink_nt(t: int) -> int:
    """8-column tiles of a sink block: every token of the batch in one block (t <= 64)."""
    n = -(-t // 8)
    return 1 if n <= 1 else 2 if n <= 2 else 4 if n <= 4 else 8


def sinks_blas(x, sw13, sw2, gam, out, topk: int) -> None:
    """The BF16 sinks of a batch through cuBLAS: out[:, topk + s] = gam[:, s] * sink_s(x). At more
    than a few tokens the sinks are a small dense GEMM, which cuBLAS streams near the bandwidth floor
    (the decode kernels' one-block-per-sink layout leaves most SMs idle there)."""
    sinks_blas_down(sinks_blas_up(x, sw13), sw2, gam, out, topk)


def sinks_blas_up(x, sw13) -> torch.Tensor:
    """sinks_blas's gate/up GEMM and SwiGLU: act [S, T, I]."""
    h13 = torch.matmul(x, sw13.transpose(1, 2))  # [S, T, 2I], gate/up interleaved
    return torch.nn.functional.silu(h13[..., 0::2]) * h13[..., 1::2]


def sinks_blas_down(act, sw2, gam, out, topk: int) -> None:
    """sinks_blas's down GEMM, scaled by the sink gammas into out's sink slots."""
    y = torch.bmm(act, sw2.transpose(1, 2))  # [S, T, H]
    n = sw2.shape[0]
    out[:, topk : topk + n].copy_((y.float() * gam.t().float().unsqueeze(-1)).transpose(0, 1))


SINK_PATHS = ("blas", "gemv")


@dataclass(frozen=True)
class SinkPlan:
    """How the fused MoE's BF16 sinks run outside the routed kernels. path: "gemv" (sink_gemv.sinks_gemv,
    two Triton launches, for batches up to its MAX_TOKENS; cuBLAS above) or "blas" (sinks_blas at every
    batch); gemv_stages: the GEMVs' pipeline stages (fewer: less shared memory a CTA, more routed CTAs
    beside them); gemv_blocks: their (gate/up, down) row bands.

    H200 sweep at d64dab0 (results/diagnostics/sink_plan_sweep_d64dab0), fused MoE us at batch 1 / 8 / 64:
    3 stages 130.9 / 559.2 / 2561, 4 stages 136.6 / 575.8 / 2560, 2 stages 129.8 / 565.9 / 2563, 64-row
    bands 134.1 / 567.4 / 2550; the sinks launched after the routed gate/up launch (from the same fork
    point) 139.8 / 569.8 / 2537, slower at batch 1 and removed since."""

    path: str = "gemv"
    gemv_stages: int = 3
    gemv_blocks: tuple[int, int] = (16, 32)


_sink_plan = SinkPlan()


def set_sink_path(name: str, **plan) -> None:
    """Choose the SinkPlan: its path and any of its other fields (benchmarks compare them:
    bench_moe_nvfp4 --sink-path, --sink-gemv-stages, --sink-gemv-blocks)."""
    global _sink_plan
    if name not in SINK_PATHS:
        raise ValueError(f"sink path {name!r}: one of {', '.join(SINK_PATHS)}")
    _sink_plan = SinkPlan(name, **plan)


def _sinks_up(x, sw13) -> torch.Tensor:
    """The sinks' gate/up projection by the SinkPlan's path: act [S, T, I] for _sinks_down."""
    if _sink_plan.path == "gemv" and x.shape[0] <= GEMV_MAX_TOKENS:
        return sinks_gemv_up(x, sw13, block_j=_sink_plan.gemv_blocks[0], num_stages=_sink_plan.gemv_stages)
    return sinks_blas_up(x, sw13)


def _sinks_down(act, sw2, gam, out, k: int) -> None:
    if _sink_plan.path == "gemv" and act.shape[1] <= GEMV_MAX_TOKENS:
        sinks_gemv_down(act, sw2, gam, out, k, block_n=_sink_plan.gemv_blocks[1], num_stages=_sink_plan.gemv_stages)
    else:
        sinks_blas_down(act, sw2, gam, out, k)


@dataclass(frozen=True)
class SinksAhead:
    """The sinks' gate/up projection launched on the side stream before the router (start_sinks): it
    needs no routing, so it streams its weights (two thirds of the sinks' bytes) while the router and
    the pairs' layout run, which read almost none. act: its output, [S, T, I], the side stream's."""

    act: torch.Tensor


def start_sinks(x, sw13) -> SinksAhead:
    """Launch the sinks' gate/up projection of x on the side stream now; moe_w4a16_decode(...,
    sinks_ahead=) runs their down projection there once the router's gammas exist, and joins."""
    main, side = torch.cuda.current_stream(x.device), _side_stream(x.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        return SinksAhead(_sinks_up(x, sw13))


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


def pdl_for(tiles: CudaTiles, x: torch.Tensor) -> bool:
    """Whether this call's gate/up and down launches run as programmatic dependents: up to tiles.pdl
    tokens, where kernels launch so at all (_triton.pdl_launch: Hopper, not inside no_pdl)."""
    return x.shape[0] <= tiles.pdl and pdl_launch(x)["PDL"]


def ring_for(tiles: CudaTiles, s13: torch.Tensor, s2: torch.Tensor) -> CudaTiles:
    """The build that serves these scale tensors (uint8 views): the row ring copies 8-byte scale
    segments, so scales whose rows (start, expert or row stride) are not 8-byte aligned take the chunk
    ring (4-byte copies) instead of failing, since the row ring is the default. Checkpoint layouts keep
    the row ring: rows of K / 16 bytes, K a multiple of 128."""
    if tiles.row_ring and any(s.data_ptr() % 8 or s.stride(0) % 8 or s.stride(1) % 8 for s in (s13, s2)):
        return replace(tiles, row_ring=0, row_tiles=1)
    return tiles


def moe_w4a16_decode(x, w13, s13, g13, w2, s2, g2, ids, weights, sw13, sw2, gam, act, out,
                     tiles: CudaTiles, alignment: Alignment | None = None,
                     sinks_ahead: SinksAhead | None = None) -> None:  # fmt: skip
    """Fill out (and act) for the routed pairs and the sinks (in the same launches when the batch
    fits tiles.kernel_sink_max, else through cuBLAS, on a side stream with tiles.sink_stream). The
    codes w13, w2 are in the mma layout (nvfp4_layout.to_mma_layout). alignment: moe_align of ids
    made ahead, used if made for tiles.block_m. sinks_ahead: the sinks' gate/up already launched on the
    side stream (start_sinks; tiles.sink_stream only)."""
    tiles = ring_for(tiles, s13, s2)
    lib = _library(tiles.defines())
    t, k = weights.shape
    n_pairs = t * k
    n_exp = w13.shape[0]
    pairs, block_expert = moe_align(ids, n_exp, tiles.block_m, alignment)
    w32 = weights.reshape(-1).float()  # the router's weights are fp32 already: no copy
    in_kernel = sw13 is not None and not tiles.sink_stream and t <= min(tiles.kernel_sink_max, MAX_SINK_TOKENS)
    side = None
    if sinks_ahead is not None:
        if sw13 is None or not tiles.sink_stream:
            raise ValueError("moe_w4a16_decode: sinks_ahead needs sinks and tiles with sink_stream")
        main, side = torch.cuda.current_stream(x.device), _side_stream(x.device)
        side.wait_stream(main)  # the gammas
        with torch.cuda.stream(side):
            _sinks_down(sinks_ahead.act, sw2, gam, out, k)
    elif sw13 is not None and not in_kernel and tiles.sink_stream:
        # Sinks and routed experts read disjoint weights: on two streams (a fork and a join that CUDA
        # graphs capture) the sinks stream while the routed launches do, where one stream would leave
        # the DRAM idle in each launch's ramp and tail. x and out belong to the main stream and outlive
        # the join; the side stream's own temporaries stay in its allocator pool.
        main, side = torch.cuda.current_stream(x.device), _side_stream(x.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            _sinks_down(_sinks_up(x, sw13), sw2, gam, out, k)
    elif sw13 is not None and not in_kernel:
        _sinks_down(_sinks_up(x, sw13), sw2, gam, out, k)
    n_sink_blocks = sw13.shape[0] if in_kernel else 0  # one block per sink: sink_nt(t) tiles of 8
    nt_s = sink_nt(t)
    g32 = gam.float() if in_kernel else w32.new_empty(0)
    sw13_, sw2_ = (sw13, sw2) if in_kernel else (x.new_empty(0), x.new_empty(0))
    n_routed = block_expert.shape[0]
    common = (pairs, block_expert, w32, g32, act, out, n_pairs, t, k, n_sink_blocks, pdl_for(tiles, x))
    for up in (True, False):
        src, codes, scales, scale2, sink = (x, w13, s13, g13, sw13_) if up else (act, w2, s2, g2, sw2_)
        if in_kernel and nt_s == tiles.nt and tiles.row_tiles == 1:  # one launch: sink blocks, then routed ones
            _launch(lib, up, tiles.nt, 1, tiles.depth, 0, n_sink_blocks + n_routed, src, codes, scales, scale2, sink,
                    *common)  # fmt: skip
            continue
        if in_kernel:
            _launch(lib, up, nt_s, 1, tiles.depth, 0, n_sink_blocks, src, codes, scales, scale2, sink, *common)
        _launch(lib, up, tiles.nt, tiles.row_tiles, tiles.depth, n_sink_blocks, n_routed, src, codes, scales, scale2,
                sink, *common)  # fmt: skip
    if side is not None:
        main.wait_stream(side)
