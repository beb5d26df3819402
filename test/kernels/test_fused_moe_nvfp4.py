"""W4A16 fused MoE (NVFP4 routed experts + BF16 sinks) vs a brute force written here.

The reference decodes the codes with its own table of the 16 e2m1 values and torch's fp8 cast,
then runs every (token, expert) pair in fp32 (fused_moe_ref); no runtime NVFP4 code is involved.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.fused_moe import Alignment, default_block_m, fused_moe_ref, moe_align  # noqa: E402
from sgl_inkling_kernels.fused_moe_nvfp4 import INTERPRETER_TILES, Tiles, default_tiles, fused_moe_nvfp4  # noqa: E402
from sgl_inkling_kernels.moe_nvfp4_gemv import INTERPRETER_GEMV_TILES, GemvTiles  # noqa: E402
from sgl_inkling_kernels.moe_w4a16_cuda import CudaTiles  # noqa: E402
from sgl_inkling_kernels.nvfp4_layout import to_mma_layout  # noqa: E402
from sgl_inkling_kernels.router import route_aligned  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

# (experts, sinks, top_k, hidden, intermediate, tokens): odd expert counts, hidden and
# intermediate sizes that are not multiples of the K tile (interpreter: 32 elements).
SHAPES = [(5, 2, 2, 48, 32, 1), (7, 1, 3, 80, 48, 3), (5, 2, 2, 48, 32, 64)]
if CUDA:
    SHAPES += [(8, 2, 6, 6144, 3072, 1), (8, 2, 6, 6144, 3072, 64), (33, 2, 6, 528, 272, 64)]


def decode(codes: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor) -> torch.Tensor:
    """Independent NVFP4 decoder: low nibble = element 2j, high = 2j + 1, value = e2m1 * fp8 * scale2."""
    table = torch.tensor(E2M1, device=codes.device)
    lo, hi = table[(codes & 15).long()], table[(codes >> 4).long()]
    vals = torch.stack([lo, hi], -1).flatten(-2)
    block = scale.float().repeat_interleave(16, dim=-1)
    return vals * block * scale2.float()[:, None, None]


def _quantized(e, rows, cols, gen, gain):
    codes = torch.randint(0, 256, (e, rows, cols // 2), generator=gen, dtype=torch.uint8)
    # Block scales over the fp8 range, subnormals (< 2^-6) included; never zero.
    scale = torch.exp2(torch.empty(e, rows, cols // 16).uniform_(-8.0, 3.0, generator=gen)).to(torch.float8_e4m3fn)
    scale2 = (torch.rand(e, generator=gen) + 0.5) * gain
    return codes.to(DEVICE), scale.to(DEVICE), scale2.to(DEVICE)


def _problem(e, s, k, h, i, t, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(DEVICE, dtype)
    w13 = _quantized(e, 2 * i, h, g, h**-0.5)
    w2 = _quantized(e, h, i, g, i**-0.5)
    sw13 = (torch.randn(s, 2 * i, h, generator=g) * h**-0.5).to(DEVICE, dtype)
    sw2 = (torch.randn(s, h, i, generator=g) * i**-0.5).to(DEVICE, dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(DEVICE)
    weights = (torch.rand(t, k, generator=g) + 0.5).to(DEVICE, dtype)
    gammas = (torch.rand(t, s, generator=g) + 0.5).to(DEVICE, dtype)
    return x, w13, w2, ids, weights, sw13, sw2, gammas


def _reference(x, w13, w2, ids, weights, sw13=None, sw2=None, gam=None):
    f = lambda t: None if t is None else t.float()  # noqa: E731
    return fused_moe_ref(x.float(), decode(*w13), decode(*w2), ids, weights.float(), f(sw13), f(sw2), f(gam))


def _mma(w):
    """A quantized weight with its codes in the mma layout (what the GPU serves); the reference keeps
    decoding the original codes."""
    return (to_mma_layout(w[0]), *w[1:])


def _assert_close(got, want, dtype):
    assert got.dtype == dtype and got.shape == want.shape
    err = (got.float() - want).norm() / want.norm()
    assert err < (1e-5 if dtype == torch.float32 else 1e-2), float(err)


ASM = [None, False] if CUDA else [None]  # on the GPU also the portable decode (None: the default)


MMA = INTERPRETER_TILES if not CUDA else Tiles()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("asm", ASM)
@pytest.mark.parametrize("path", ["gemv", "mma"])
def test_matches_reference(shape, dtype, asm, path):
    """Both paths on every shape: the small-M GEMVs (what decode batches dispatch to) and the MMA kernels."""
    if asm is False and dtype == torch.float32:
        pytest.skip("fp32 always takes the portable decode")
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(*shape, dtype, seed=sum(shape))
    tiles = MMA if path == "mma" else default_tiles(ids.numel(), shape[0])
    if path == "gemv":
        assert isinstance(tiles, GemvTiles)  # these shapes dispatch to it (where the CUDA kernels do not)
    got = fused_moe_nvfp4(x, *w13, *w2, ids, weights, sw13, sw2, gam, asm=asm, tiles=tiles)
    _assert_close(got, _reference(x, w13, w2, ids, weights, sw13, sw2, gam), dtype)
    routed = fused_moe_nvfp4(x, *w13, *w2, ids, weights, asm=asm, tiles=tiles)  # no sinks
    _assert_close(routed, _reference(x, w13, w2, ids, weights), dtype)


# Blocks of 1, 2 and 4 pairs, K steps that do not divide H or I (or exceed them), sinks in the GEMVs
# (sink_max >= T) or in the MMA kernels (sink_max < T).
GEMV_CASES = [
    ((7, 2, 3, 80, 48, 3), GemvTiles(bm=1, up_n=16, down_n=32, kw=4, kw_sink=4, warps=1, sink_max=4)),
    ((5, 2, 2, 48, 32, 9), GemvTiles(bm=4, up_n=8, down_n=16, kw=8, kw_sink=2, warps=1, sink_max=0)),
    ((9, 1, 4, 64, 80, 2), GemvTiles(bm=2, up_n=32, down_n=64, kw=2, kw_sink=8, warps=2, sink_max=2)),
]
if CUDA:
    GEMV_CASES += [((8, 2, 6, 6144, 3072, 8), GemvTiles(bm=2, sink_max=8)),
                   ((33, 2, 6, 528, 272, 64), GemvTiles(bm=4, sink_max=0))]  # fmt: skip


@pytest.mark.parametrize("shape,tiles", GEMV_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_tiles_match_reference(shape, tiles, dtype):
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(*shape, dtype, seed=7 + sum(shape))
    got = fused_moe_nvfp4(x, *w13, *w2, ids, weights, sw13, sw2, gam, tiles=tiles)
    _assert_close(got, _reference(x, w13, w2, ids, weights, sw13, sw2, gam), dtype)


def test_dispatch_small_m_for_decode_mma_for_prefill():
    assert default_tiles(6, 256).bm == 1 and default_tiles(64 * 6, 256).bm == 2
    assert isinstance(default_tiles(4096 * 6, 256), Tiles)


@pytest.mark.parametrize("with_sinks", [True, False])
@pytest.mark.parametrize("tiles", [MMA, INTERPRETER_GEMV_TILES if not CUDA else GemvTiles(bm=2)])
def test_foreign_ids_contribute_zero(with_sinks, tiles):
    """Expert parallelism: id E is an expert held by another rank; its pairs add nothing."""
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(7, 2, 3, 48, 32, 5, torch.float32, seed=11)
    foreign = ids % 3 == 0
    sinks = (sw13, sw2, gam) if with_sinks else (None, None, None)
    got = fused_moe_nvfp4(x, *w13, *w2, torch.where(foreign, 7, ids), weights, *sinks, foreign_ids=True,
                          tiles=tiles)  # fmt: skip
    want = _reference(x, w13, w2, ids, torch.where(foreign, 0.0, weights), *sinks)
    _assert_close(got, want, torch.float32)


def _router_problem(e, s, k, h, i, t, dtype, seed, block_m):
    """A problem routed as the model's decode routes it (route_aligned: fp32 weights, the pairs' layout
    for block_m made in the routing launch)."""
    x, w13, w2, _, _, sw13, sw2, _ = _problem(e, s, k, h, i, t, dtype, seed)
    logits = torch.randn(t, e + s, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    bias, gscale = torch.zeros(e, device=DEVICE), torch.ones(1, device=DEVICE)
    routed = route_aligned(logits, bias, gscale, k, 2.0, dtype, block_m)
    return x, w13, w2, sw13, sw2, *routed


def _misplaced(align: Alignment, e: int) -> Alignment:
    """The alignment with every block given the next expert: a layout that, if used, changes the output."""
    be = align.block_expert
    return Alignment(align.pairs, torch.where(be >= 0, (be + 1) % e, be), align.block_m)


@pytest.mark.parametrize("path", ["gemv", "mma"])
def test_router_alignment_gives_the_same_output(path):
    """Given the router's alignment for the block size its path takes, fused_moe_nvfp4 gives bit for bit
    what it gives aligning for itself; an alignment for another block size is left aside; and the
    alignment is what it uses (a misplaced one changes the output)."""
    e, s, k, h, i, t = 5, 2, 2, 48, 32, 3
    tiles = MMA if path == "mma" else default_tiles(t * k, e)
    block_m = default_block_m(t * k, e) if path == "mma" else tiles.bm
    x, w13, w2, sw13, sw2, ids, w, gam, align = _router_problem(e, s, k, h, i, t, torch.float32, 21, block_m)

    def run(alignment):
        return fused_moe_nvfp4(x, *w13, *w2, ids, w, sw13, sw2, gam, tiles=tiles, alignment=alignment)

    want = run(None)
    _assert_close(want, _reference(x, w13, w2, ids, w, sw13, sw2, gam), torch.float32)
    assert torch.equal(run(align), want)
    other = Alignment(*moe_align(ids, e, 2 * block_m), 2 * block_m)
    assert torch.equal(run(_misplaced(other, e)), want)
    assert not torch.equal(run(_misplaced(align, e)), want)


@pytest.mark.skipif(not CUDA, reason="CUDA kernels")
@pytest.mark.parametrize("tiles", [None, CudaTiles(nt=2)], ids=["default", "nt2"])
def test_cuda_decode_takes_the_router_alignment(tiles):
    """The CUDA decode kernels given the router's alignment for their block size (cuda_block_m for the
    default tiles): bit for bit what they give aligning for themselves, and near the reference."""
    from sgl_inkling_kernels.moe_w4a16_cuda import cuda_block_m

    e, s, k, h, i, t = 16, 2, 6, 256, 128, 5  # 30 pairs over 16 experts: blocks of 16 hold several
    block_m = tiles.block_m if tiles else cuda_block_m(t * k, e, t)
    x, w13, w2, sw13, sw2, ids, w, gam, align = _router_problem(e, s, k, h, i, t, torch.bfloat16, 23, block_m)

    def run(alignment):
        return fused_moe_nvfp4(x, *_mma(w13), *_mma(w2), ids, w, sw13, sw2, gam, layout="mma", tiles=tiles,
                               alignment=alignment)  # fmt: skip

    want = run(None)
    _assert_close(want, _reference(x, w13, w2, ids, w, sw13, sw2, gam), torch.bfloat16)
    assert torch.equal(run(align), want)
    assert not torch.equal(run(_misplaced(align, e)), want)


def test_tile_masks_and_token_chunks():
    """N and K tiles that overhang every dimension, and a prefill cut into token chunks."""
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(5, 1, 2, 80, 48, 7, torch.float32, seed=3)
    want = _reference(x, w13, w2, ids, weights, sw13, sw2, gam)
    tiles = Tiles(up_n=32, down_n=32, kb=32, bk_sink=32, warps=4, stages=1)
    _assert_close(fused_moe_nvfp4(x, *w13, *w2, ids, weights, sw13, sw2, gam, tiles=tiles), want, torch.float32)
    _assert_close(fused_moe_nvfp4(x, *w13, *w2, ids, weights, sw13, sw2, gam, max_tokens=3), want, torch.float32)


def test_refuses_wrong_layout_naming_the_tensor():
    x, w13, w2, ids, weights, *_ = _problem(5, 1, 2, 48, 32, 1, torch.float32, seed=4)
    with pytest.raises(ValueError, match="w13_scale"):
        fused_moe_nvfp4(x, w13[0], w13[1].float(), w13[2], *w2, ids, weights)
    with pytest.raises(ValueError, match="w2 "):
        fused_moe_nvfp4(x, *w13, w2[0][:, :, :-1], *w2[1:], ids, weights)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 2, 2, 48, 32, 3), (7, 1, 3, 80, 48, 64)])
def test_mma_kernels_read_the_mma_layout(shape, dtype):
    """The MMA kernels (prefill on the GPU, where serving holds the mma layout) on codes in the mma
    layout, and the default dispatch (which must not take the GEMVs for them): equal to the reference
    of the original codes."""
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(*shape, dtype, seed=17 + sum(shape))
    want = _reference(x, w13, w2, ids, weights, sw13, sw2, gam)
    for tiles in (MMA, None):
        got = fused_moe_nvfp4(x, *_mma(w13), *_mma(w2), ids, weights, sw13, sw2, gam, tiles=tiles, layout="mma")
        _assert_close(got, want, dtype)


def test_kernels_refuse_a_code_layout_they_cannot_read():
    x, w13, w2, ids, weights, *_ = _problem(5, 1, 2, 256, 128, 1, torch.float32, seed=4)
    with pytest.raises(ValueError, match="GemvTiles read codes in the checkpoint layout"):
        fused_moe_nvfp4(x, *_mma(w13), *_mma(w2), ids, weights, tiles=INTERPRETER_GEMV_TILES, layout="mma")
    with pytest.raises(ValueError, match="CudaTiles read codes in the mma layout"):
        fused_moe_nvfp4(x, *w13, *w2, ids, weights, tiles=CudaTiles())
    with pytest.raises(ValueError, match="layout must be one of"):
        fused_moe_nvfp4(x, *w13, *w2, ids, weights, layout="marlin")


# The CUDA decode kernels (GPU only): blocks of 8 * nt pairs, 2 or 4 K chunks in flight, sinks in the
# same launch (T <= 8), in their own launch (8 < T <= 64) or in the Triton MMA kernels (T > 64);
# experts with more pairs than a block; H and I multiples of the 128-element chunk only.
CUDA_CASES = [
    ((8, 2, 6, 6144, 3072, 1), None),
    ((8, 2, 6, 6144, 3072, 64), None),
    ((33, 2, 6, 512, 256, 5), CudaTiles(row_ring=0, nt=1, depth=4)),
    ((9, 1, 4, 256, 384, 40), CudaTiles(row_ring=0, nt=2)),
    ((17, 2, 6, 1024, 512, 100), CudaTiles(row_ring=0, nt=4)),
    ((5, 2, 2, 384, 128, 64), CudaTiles(row_ring=0, nt=8, depth=4)),
    ((12, 0, 3, 640, 256, 3), CudaTiles(row_ring=0, nt=1)),
    # build choices (one library each): the cp.async ring with split launches, 8 warps with the
    # activation prefetch, and the ring under more column tiles
    ((8, 2, 6, 6144, 3072, 1), CudaTiles(row_ring=0, nt=1, cp_async=8, split_sinks=1)),
    ((33, 2, 6, 512, 256, 5), CudaTiles(row_ring=0, nt=1, cp_async=6, split_sinks=1)),
    ((9, 1, 4, 256, 384, 40), CudaTiles(row_ring=0, nt=1, depth=2, warps=8, x_prefetch=1, cp_async=0, split_sinks=0)),
    ((17, 2, 6, 1024, 512, 100), CudaTiles(row_ring=0, nt=4, cp_async=8)),
    # the sinks through cuBLAS on a side stream, concurrent with the routed launches
    ((8, 2, 6, 6144, 3072, 1), CudaTiles(row_ring=0, nt=1, sink_stream=1)),
    ((33, 2, 6, 512, 256, 40), CudaTiles(row_ring=0, nt=1, sink_stream=1)),
    # the down launch as a programmatic dependent launch (weights streamed before the gate/up grid ends),
    # also past the batches the default takes it for (pdl: up to that many tokens)
    ((8, 2, 6, 6144, 3072, 1), CudaTiles(row_ring=0, nt=1, pdl=1)),
    ((17, 2, 6, 1024, 512, 100), CudaTiles(row_ring=0, nt=4, pdl=128, sink_stream=0, split_sinks=1)),
    ((9, 1, 4, 256, 384, 5), CudaTiles(row_ring=0, nt=1, depth=2, x_prefetch=1, cp_async=0, pdl=8, sink_stream=0)),
    ((8, 2, 6, 6144, 3072, 64), CudaTiles(pdl=0)),
    # the row ring's generic loop in CTAs of 4 warps (the default before the lean loop; copies of whole
    # 128-byte row spans): batch 1 and 64 at full width, the sinks in the kernel, 2 / 4 / 8 column tiles
    # (the ring clamped to the shared memory), odd chunk counts (H 640, I 384 as under TP 8: a half last
    # stage)
    ((8, 2, 6, 6144, 3072, 1), CudaTiles(nt=1, row_ring=4, warps=4, lean=0)),
    ((8, 2, 6, 6144, 3072, 64), CudaTiles(nt=1, row_ring=4, warps=4, lean=0)),
    ((8, 2, 6, 6144, 384, 1), CudaTiles(nt=1, row_ring=4, warps=4, lean=0)),
    ((33, 2, 6, 512, 256, 5), CudaTiles(nt=1, row_ring=3, warps=4, lean=0, sink_stream=0, split_sinks=0)),
    ((9, 1, 4, 256, 512, 40), CudaTiles(nt=2, row_ring=5, warps=4)),
    ((17, 2, 6, 1024, 512, 100), CudaTiles(nt=4, row_ring=5, warps=4)),
    ((5, 2, 2, 512, 256, 64), CudaTiles(nt=8, row_ring=5, warps=4)),
    ((12, 0, 3, 640, 384, 3), CudaTiles(nt=1, row_ring=4, warps=4, lean=0)),
    # the lean loop (one column tile; more tiles keep the generic loop) in CTAs of 4 warps: full width at
    # batch 1 and 64, half last stages (I 384; H 640), the sinks in the kernel, 2 tiles, a 3-stage ring
    ((8, 2, 6, 6144, 3072, 1), CudaTiles(nt=1, lean=1, warps=4, row_ring=4)),
    ((8, 2, 6, 6144, 3072, 64), CudaTiles(nt=1, lean=1, warps=4, row_ring=4)),
    ((8, 2, 6, 6144, 384, 1), CudaTiles(nt=1, lean=1, warps=4, row_ring=4)),
    ((12, 0, 3, 640, 384, 3), CudaTiles(nt=1, lean=1, warps=4, row_ring=4)),
    ((33, 2, 6, 512, 256, 5), CudaTiles(nt=1, row_ring=3, lean=1, warps=4, sink_stream=0, split_sinks=0)),
    ((9, 1, 4, 256, 512, 40), CudaTiles(nt=2, lean=1, warps=4, row_ring=4)),
    # ... in CTAs of one or two warps (a warp's stages cover all of K, or half; 2 warps and 3 stages are
    # the shipped build, which the first two cases, tiles None, also take)
    ((8, 2, 6, 6144, 3072, 1), CudaTiles(nt=1, lean=1, warps=1, row_ring=3)),
    ((8, 2, 6, 6144, 3072, 64), CudaTiles(nt=1, lean=1, warps=2, row_ring=3)),
    ((12, 0, 3, 640, 384, 3), CudaTiles(nt=1, lean=1, warps=1, row_ring=2)),
    ((33, 2, 6, 512, 256, 5), CudaTiles(nt=1, lean=1, warps=2, row_ring=3, sink_stream=0, split_sinks=0)),
    ((9, 1, 4, 256, 512, 40), CudaTiles(nt=2, lean=1, warps=1, row_ring=3)),
    # two row tiles a CTA (csrc tile_pair, the lean loop 32 rows deep): full width at batch 1 and 64, half
    # last stages (I 384; H 640), the sinks in a launch of their own, a 2-stage ring of 4 warps (clamped to
    # the shared memory), and the default dispatch at a batch with enough blocks to take it (64 experts)
    ((8, 2, 6, 6144, 3072, 1), CudaTiles(nt=1, row_tiles=2)),
    ((8, 2, 6, 6144, 3072, 64), CudaTiles(nt=1, row_tiles=2)),
    ((8, 2, 6, 6144, 384, 1), CudaTiles(nt=1, row_tiles=2)),
    ((12, 0, 3, 640, 384, 3), CudaTiles(nt=1, row_tiles=2)),
    ((33, 2, 6, 512, 256, 5), CudaTiles(nt=1, row_tiles=2, sink_stream=0, split_sinks=0)),
    ((8, 2, 6, 6144, 3072, 64), CudaTiles(nt=1, row_tiles=2, warps=4, row_ring=4)),
    ((64, 2, 6, 1024, 512, 40), None),
]


def _case_id(case) -> str:
    """The ring in the test id, so that a GPU run can select one ring's cases with -k (and run them in
    a process of their own: a kernel fault poisons its process's CUDA context)."""
    shape, tiles = case
    ring = "default" if tiles is None else "pair" if tiles.row_tiles == 2 else "lean" if tiles.lean else \
        "row_ring" if tiles.row_ring else "chunk"  # fmt: skip
    return ring + "-" + "x".join(map(str, shape))


@pytest.mark.skipif(not CUDA, reason="CUDA kernels")
@pytest.mark.parametrize("shape,tiles", CUDA_CASES, ids=[_case_id(c) for c in CUDA_CASES])
def test_cuda_decode_matches_reference(shape, tiles):
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(*shape, torch.bfloat16, seed=5 + sum(shape))
    if not shape[1]:
        sw13 = sw2 = gam = None
    got = fused_moe_nvfp4(x, *_mma(w13), *_mma(w2), ids, weights, sw13, sw2, gam, tiles=tiles, layout="mma")
    _assert_close(got, _reference(x, w13, w2, ids, weights, sw13, sw2, gam), torch.bfloat16)


@pytest.mark.skipif(not CUDA, reason="CUDA kernels")
@pytest.mark.parametrize("pdl,row_ring,row_tiles", [(0, 0, 1), (128, 0, 1), (0, 4, 1), (0, 3, 2)],
                         ids=["chunk", "chunk-pdl", "row_ring", "pair"])  # fmt: skip
def test_side_stream_sinks_replay_from_a_cuda_graph(pdl, row_ring, row_tiles):
    """The side-stream fork and join (and the programmatic launch edge, the row ring's copies, the
    row tile pairs) are captured: replays on new inputs equal the reference."""
    tiles = CudaTiles(nt=1, sink_stream=1, pdl=pdl, row_ring=row_ring, row_tiles=row_tiles)
    _graph_replays_match_reference(tiles, 21, (1, 2))


def _graph_replays_match_reference(tiles: CudaTiles | None, seed: int, replay_seeds: tuple[int, ...],
                                   ahead: bool = False) -> None:  # fmt: skip
    """Capture the fused MoE on one problem, then replay it on the inputs of others (the weights kept):
    every replay equals the reference. ahead: the sinks' gate/up launched first (sinks_ahead_nvfp4)."""
    from sgl_inkling_kernels.fused_moe_nvfp4 import sinks_ahead_nvfp4

    shape = (16, 2, 6, 1024, 512, 4)
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(*shape, torch.bfloat16, seed=seed)
    static = [t.clone() for t in (x, ids, weights, gam)]
    m13, m2 = _mma(w13), _mma(w2)

    def run():
        sa = sinks_ahead_nvfp4(static[0], m13[0], sw13, shape[2], "mma") if ahead else None
        assert (sa is not None) == ahead
        return fused_moe_nvfp4(static[0], *m13, *m2, static[1], static[2], sw13, sw2, static[3], tiles=tiles,
                               layout="mma", sinks_ahead=sa)  # fmt: skip

    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = run()
    for s in replay_seeds:
        x2, _, _, ids2, weights2, _, _, gam2 = _problem(*shape, torch.bfloat16, seed=s)
        for dst, src in zip(static, (x2, ids2, weights2, gam2)):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        _assert_close(got, _reference(x2, w13, w2, ids2, weights2, sw13, sw2, gam2), torch.bfloat16)


@pytest.mark.skipif(not CUDA, reason="CUDA kernels")
@pytest.mark.parametrize("plan", [{"path": "blas"}, {"path": "gemv", "gemv_stages": 2, "gemv_blocks": (64, 64)}],
                         ids=["blas", "gemv-2-stages-64x64"])  # fmt: skip
def test_sink_plans_replay_from_a_cuda_graph(plan):
    """The SinkPlans the benchmarks compare beside the default (which the side-stream test runs) capture
    and replay to the reference."""
    import dataclasses

    from sgl_inkling_kernels.moe_w4a16_cuda import SinkPlan, set_sink_path

    plan, default = dict(plan), dataclasses.asdict(SinkPlan())
    set_sink_path(plan.pop("path"), **plan)
    try:
        _graph_replays_match_reference(CudaTiles(nt=1, sink_stream=1), 23, (3, 4))
    finally:
        set_sink_path(default.pop("path"), **default)


@pytest.mark.skipif(not CUDA, reason="CUDA kernels")
@pytest.mark.parametrize("shape", [(8, 2, 6, 6144, 3072, 1), (64, 2, 6, 1024, 512, 64), (64, 2, 6, 1024, 512, 80)],
                         ids=["slice-bs1", "gemv-bs64", "blas-bs80"])  # fmt: skip
def test_sinks_started_ahead_of_the_router_match_reference(shape):
    """The sinks' gate/up launched on the side stream before routing (as MoE.forward does), their down
    projection in fused_moe_nvfp4 once the gammas exist: the GEMV path (up to 64 tokens) and cuBLAS."""
    from sgl_inkling_kernels.fused_moe_nvfp4 import sinks_ahead_nvfp4

    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(*shape, torch.bfloat16, seed=31 + shape[-1])
    m13, m2 = _mma(w13), _mma(w2)
    ahead = sinks_ahead_nvfp4(x, m13[0], sw13, shape[2], "mma")
    assert ahead is not None and ahead.act.shape == (shape[1], shape[-1], shape[4])
    got = fused_moe_nvfp4(x, *m13, *m2, ids, weights, sw13, sw2, gam, layout="mma", sinks_ahead=ahead)
    _assert_close(got, _reference(x, w13, w2, ids, weights, sw13, sw2, gam), torch.bfloat16)


@pytest.mark.skipif(not CUDA, reason="CUDA kernels")
def test_sinks_started_ahead_replay_from_a_cuda_graph():
    _graph_replays_match_reference(None, 25, (5, 6), ahead=True)


def test_sinks_ahead_only_where_the_cuda_decode_kernels_take_them():
    """Nothing is launched ahead off the CUDA decode path (the CPU, the checkpoint's code layout, no
    sinks), and a handle given to another path is refused rather than its sinks computed twice."""
    from sgl_inkling_kernels.fused_moe_nvfp4 import sinks_ahead_nvfp4
    from sgl_inkling_kernels.moe_w4a16_cuda import SinksAhead

    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(8, 2, 2, 128, 128, 3, torch.float32, seed=3)
    assert sinks_ahead_nvfp4(x, w13[0], sw13, 2, "mma") is None  # CPU x (or the checkpoint's layout below)
    assert sinks_ahead_nvfp4(x, w13[0], sw13, 2) is None
    assert sinks_ahead_nvfp4(x, w13[0], None, 2, "mma") is None
    with pytest.raises(ValueError, match="sinks_ahead is for the CUDA decode kernels"):
        fused_moe_nvfp4(x, *w13, *w2, ids, weights, sw13, sw2, gam, sinks_ahead=SinksAhead(torch.empty(0)))


def _shifted(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of t that starts `offset` bytes into its storage (same shape and strides)."""
    raw = torch.empty(t.numel() * t.element_size() + offset, dtype=torch.uint8, device=t.device)[offset:]
    return raw.view(t.dtype).view(t.shape).copy_(t)


def test_scales_off_8_byte_boundaries_take_the_chunk_ring():
    """The row ring (the default) copies 8-byte scale segments: scales whose start, expert or row stride
    is off an 8-byte boundary get the chunk ring (every other field kept) instead of an error; aligned
    scales keep the row ring, and a chunk-ring build is left alone."""
    from sgl_inkling_kernels.moe_w4a16_cuda import ring_for

    _, (_, s13, _), (_, s2, _), *_ = _problem(4, 0, 2, 256, 384, 1, torch.float32, seed=2)
    s13, s2 = s13.view(torch.uint8), s2.view(torch.uint8)  # I = 384: 24-byte scale rows are 8-byte aligned
    tiles = CudaTiles(nt=2, pdl=1)
    assert tiles.row_ring and ring_for(tiles, s13, s2) == tiles
    assert ring_for(tiles, s13, _shifted(s2, 8)) == tiles
    for off in (_shifted(s2, 4), _shifted(s2, 1)):
        assert ring_for(tiles, s13, off) == CudaTiles(nt=2, pdl=1, row_ring=0)
    e, rows, n = s13.shape
    padded = torch.empty(e, rows, n + 4, dtype=torch.uint8)[:, :, :n]  # rows 4 bytes longer than their 16
    experts = torch.empty(e * (rows * n + 4), dtype=torch.uint8).as_strided(s13.shape, (rows * n + 4, n, 1))
    assert ring_for(tiles, padded, s2).row_ring == 0 and ring_for(tiles, experts, s2).row_ring == 0
    chunk = CudaTiles(row_ring=0)
    assert ring_for(chunk, s13, _shifted(s2, 4)) is chunk


@pytest.mark.skipif(not CUDA, reason="CUDA kernels")
def test_default_build_serves_scales_off_8_byte_boundaries():
    """Scales 4 bytes into their storage, under the default build (the row ring): served (through the
    chunk ring) and equal to the reference."""
    x, w13, w2, ids, weights, *_ = _problem(8, 0, 2, 256, 384, 1, torch.bfloat16, seed=9)
    codes, scales, scale2 = _mma(w13)
    got = fused_moe_nvfp4(x, codes, _shifted(scales, 4), scale2, *_mma(w2), ids, weights, layout="mma")
    _assert_close(got, _reference(x, w13, w2, ids, weights, None, None, None), torch.bfloat16)


@pytest.mark.skipif(not CUDA, reason="CUDA kernels")
def test_cuda_decode_is_the_default_and_skips_foreign_ids():
    from sgl_inkling_kernels import fused_moe_nvfp4 as mod

    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(7, 2, 3, 256, 128, 5, torch.bfloat16, seed=13)
    calls = []
    real = mod.moe_w4a16_decode
    mod.moe_w4a16_decode = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        foreign = ids % 3 == 0
        got = fused_moe_nvfp4(x, *_mma(w13), *_mma(w2), torch.where(foreign, 7, ids), weights, sw13, sw2, gam,
                              foreign_ids=True, layout="mma")  # fmt: skip
        assert calls, "decode batches on a CUDA GPU go to the CUDA kernels"
        calls.clear()  # the checkpoint's layout: the CUDA kernels cannot read it, the default dispatch avoids them
        fused_moe_nvfp4(x, *w13, *w2, ids, weights, sw13, sw2, gam)
        assert not calls
    finally:
        mod.moe_w4a16_decode = real
    want = _reference(x, w13, w2, ids, torch.where(foreign, 0.0, weights.float()), sw13, sw2, gam)
    _assert_close(got, want, torch.bfloat16)


def test_blas_sinks_match_a_brute_force():
    """The cuBLAS sink path of the CUDA decode (larger batches) is plain torch: checked on any device."""
    from sgl_inkling_kernels.moe_w4a16_cuda import sinks_blas

    g = torch.Generator().manual_seed(21)
    t, k, s, h, i = 5, 3, 2, 32, 16
    x = torch.randn(t, h, generator=g)
    sw13, sw2 = torch.randn(s, 2 * i, h, generator=g) * h**-0.5, torch.randn(s, h, i, generator=g) * i**-0.5
    gam = torch.rand(t, s, generator=g) + 0.5
    out = torch.full((t, k + s, h), float("nan"))
    sinks_blas(x, sw13, sw2, gam, out, k)
    for tok in range(t):
        for j in range(s):
            gu = sw13[j] @ x[tok]  # gate rows 2n, up rows 2n + 1
            act = torch.nn.functional.silu(gu[0::2]) * gu[1::2]
            torch.testing.assert_close(out[tok, k + j], gam[tok, j] * (sw2[j] @ act), rtol=1e-5, atol=1e-6)
    assert out[:, :k].isnan().all()  # routed slots are not its business


def test_default_cuda_tiles_pair_row_tiles_where_the_blocks_fill_the_gpu():
    """Two row tiles a CTA (half the CTAs) once a batch hits ROW_TILE_PAIR_MIN_BLOCKS experts or more, with
    one column tile and the lean row ring; the build (library) stays the same; tiles
    that cannot take them are refused, and scales off 8-byte rows (the chunk ring) fall back to one."""
    from dataclasses import replace

    from sgl_inkling_kernels import moe_w4a16_cuda as m

    lo = m.ROW_TILE_PAIR_MIN_BLOCKS
    for t in (1, 2, 4, 8, 16, 32, 64):
        for e in (8, 64, 256):
            tiles = m.default_cuda_tiles(t * 6, e, t)
            assert tiles.row_tiles == (2 if tiles.nt == 1 and min(t * 6, e) >= lo else 1), (t, e)
    assert m.default_cuda_tiles(64 * 6, 256, 64).row_tiles == 2  # inkling's batch 64
    assert m.default_cuda_tiles(6, 256, 1).row_tiles == 1  # batch 1: 6 blocks
    assert m.default_cuda_tiles(8 * 6, 256, 8).row_tiles == 1  # batch 8: 48 blocks, slower with pairs
    assert len({m.default_cuda_tiles(t * 6, 256, t).defines() for t in (1, 64)}) == 1
    shipped = m.BUILD
    try:
        m.BUILD = replace(shipped, lean=0)
        assert m.default_cuda_tiles(64 * 6, 256, 64).row_tiles == 1
    finally:
        m.BUILD = shipped
    for bad in (dict(row_ring=0), dict(lean=0), dict(nt=2), dict(row_tiles=3)):
        with pytest.raises(ValueError, match="row_tiles"):
            CudaTiles(**{"nt": 1, "row_tiles": 2, **bad})
    odd = torch.zeros(4, 16, 20, dtype=torch.uint8)[:, :, 1:17]  # scale rows starting off 8 bytes
    assert m.ring_for(CudaTiles(nt=1, row_tiles=2), odd, odd) == CudaTiles(nt=1, row_ring=0)


def test_default_cuda_tiles_build_one_library_per_sink_choice():
    """With the sinks on a side stream (shipped) every decode batch loads the same library; with sinks
    in the kernels, batch 1 gets the one-launch build and larger batches the split one."""
    from dataclasses import replace

    from sgl_inkling_kernels import moe_w4a16_cuda as m

    shipped = m.BUILD
    assert shipped.sink_stream
    assert len({m.default_cuda_tiles(t * 6, 256, t).defines() for t in (1, 2, 8, 64)}) == 1
    try:
        m.BUILD = replace(shipped, sink_stream=0, split_sinks=1, one_launch_max=1)
        assert m.default_cuda_tiles(6, 256, 1).split_sinks == 0
        assert m.default_cuda_tiles(48, 256, 8).split_sinks == 1
    finally:
        m.BUILD = shipped
