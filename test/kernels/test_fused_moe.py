"""Fused MoE (grouped GEMM with SwiGLU, routed + shared experts) vs the torch reference."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.fused_moe import (  # noqa: E402
    CHUNK_ALIGN,
    SMALL_ALIGN_PAIRS,
    SORT_ALIGN_PAIRS,
    _moe_align_torch,
    align_blocks,
    chunk_cap,
    fused_moe,
    fused_moe_ref,
    moe_align,
    moe_align_small,
    moe_align_sorted,
    one_program_align,
    token_chunks,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# (experts, shared, top_k, hidden, intermediate, tokens)
if CUDA:
    # Full width with fewer experts (256 full-width experts would be 29 GB per dtype), and all 256
    # experts at a narrow width for the routing breadth.
    SHAPES = [(32, 2, 6, 6144, 3072, 1), (32, 2, 6, 6144, 3072, 64), (256, 2, 6, 256, 128, 200), (8, 2, 2, 100, 48, 5)]
else:
    SHAPES = [(8, 2, 2, 32, 16, 1), (8, 2, 2, 40, 24, 7), (16, 1, 3, 32, 32, 20)]


def _problem(e, s, k, h, i, t, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    gd = torch.Generator(device=DEVICE).manual_seed(seed)  # large weights are drawn on the device

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gd, device=DEVICE) * scale).to(dtype)

    x = rnd(t, h)
    w13, w2 = rnd(e, 2 * i, h, scale=h**-0.5), rnd(e, h, i, scale=i**-0.5)
    sw13, sw2 = rnd(s, 2 * i, h, scale=h**-0.5), rnd(s, h, i, scale=i**-0.5)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(DEVICE)
    weights = (torch.rand(t, k, generator=g) + 0.5).to(DEVICE, dtype)
    gammas = (torch.rand(t, s, generator=g) + 0.5).to(DEVICE, dtype)
    return x, w13, w2, ids, weights, sw13, sw2, gammas


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_matches_reference(shape, dtype):
    args = _problem(*shape, dtype, seed=sum(shape))
    got = fused_moe(*args)
    want = fused_moe_ref(*args)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("block_m", [16, 32])
def test_fused_moe_routed_only_and_block_sizes(block_m):
    x, w13, w2, ids, weights, *_ = _problem(*SHAPES[-1], torch.float32, seed=5)
    got = fused_moe(x, w13, w2, ids, weights, block_m=block_m)
    torch.testing.assert_close(got, fused_moe_ref(x, w13, w2, ids, weights), atol=1e-4, rtol=1e-4)


def test_fused_moe_takes_the_router_alignment():
    """Given the router's alignment (route_aligned) for its block size, fused_moe gives bit for bit what
    it gives aligning for itself, and uses it (a misplaced layout changes the output)."""
    from sgl_inkling_kernels.fused_moe import Alignment, default_block_m
    from sgl_inkling_kernels.router import route_aligned

    e, s, k, h, i, t = 8, 2, 2, 32, 16, 7
    x, w13, w2, _, _, sw13, sw2, _ = _problem(e, s, k, h, i, t, torch.float32, seed=8)
    logits = torch.randn(t, e + s, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    bias, gs = torch.zeros(e, device=DEVICE), torch.ones(1, device=DEVICE)
    ids, w, gam, align = route_aligned(logits, bias, gs, k, 2.0, x.dtype, default_block_m(t * k, e))
    want = fused_moe(x, w13, w2, ids, w, sw13, sw2, gam)
    torch.testing.assert_close(want, fused_moe_ref(x, w13, w2, ids, w, sw13, sw2, gam), atol=1e-4, rtol=1e-4)
    assert torch.equal(fused_moe(x, w13, w2, ids, w, sw13, sw2, gam, alignment=align), want)
    be = align.block_expert
    misplaced = Alignment(align.pairs, torch.where(be >= 0, (be + 1) % e, be), align.block_m)
    assert not torch.equal(fused_moe(x, w13, w2, ids, w, sw13, sw2, gam, alignment=misplaced), want)


def test_fused_moe_token_chunks_agree():
    args = _problem(*SHAPES[-1], torch.float32, seed=6)
    torch.testing.assert_close(fused_moe(*args, max_tokens=3), fused_moe(*args), atol=1e-5, rtol=1e-5)


def test_token_chunks_launch_no_kernel_variant_the_first_chunk_did_not():
    """Chunks past the first start on a multiple of CHUNK_ALIGN rows, so the routing weights' views
    ([T, k] and [T, S] fp32: 8 bytes a token here) keep the first chunk's 16-byte pointer alignment,
    which Triton keys its variants on: a long prefill compiles nothing warm-up's one chunk did not.
    (Cut evenly, 151 rows made chunks from rows 51 and 101, 408 and 808 bytes into the weights.)"""
    from sgl_inkling_kernels.jit_keys import record_keys

    x, w13, w2, ids, weights, sw13, sw2, gammas = _problem(8, 2, 2, 32, 16, 151, torch.float32, seed=9)
    chunks = token_chunks(151, 64)
    assert len(chunks) == 3 and all(a % 16 == 0 for a, _ in chunks)
    a, b = chunks[0]
    with record_keys() as first:
        want = fused_moe(x[a:b], w13, w2, ids[a:b], weights[a:b], sw13, sw2, gammas[a:b], max_tokens=64)
    with record_keys() as whole:
        got = fused_moe(x, w13, w2, ids, weights, sw13, sw2, gammas, max_tokens=64)
    assert whole.new_since(first.keys()) == []
    torch.testing.assert_close(got[a:b], want, atol=1e-6, rtol=1e-6)


def test_moe_align_covers_every_pair_once():
    ids = torch.tensor([[3, 1], [3, 0], [1, 3], [7, 3]], device=DEVICE)
    pairs, block_expert = moe_align(ids, 8, 2)
    flat = ids.reshape(-1)
    real = pairs[pairs < flat.numel()]
    assert sorted(real.tolist()) == list(range(flat.numel()))
    # Each block holds pairs of its own expert only; unused blocks are marked -1.
    for b, e in enumerate(block_expert.tolist()):
        chunk = pairs[b * 2 : (b + 1) * 2]
        chunk = chunk[chunk < flat.numel()]
        if e < 0:
            assert chunk.numel() == 0
        else:
            assert (flat[chunk] == e).all() and chunk.numel() > 0


def test_fused_moe_skips_foreign_experts():
    """Expert parallelism: id E marks an expert held by another rank; its pairs add nothing."""
    x, w13, w2, ids, weights, sw13, sw2, gam = _problem(*SHAPES[-1], torch.float32, seed=7)
    e = w13.shape[0]
    foreign = ids % 3 == 0
    got = fused_moe(x, w13, w2, torch.where(foreign, e, ids), weights, sw13, sw2, gam, foreign_ids=True)
    # Reference: the same pairs with zero weight (ids kept valid for the reference loop).
    want = fused_moe_ref(x, w13, w2, ids, torch.where(foreign, 0.0, weights), sw13, sw2, gam)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tokens,top_k,experts,block_m", [(1, 6, 256, 16), (1, 2, 2, 16), (5, 6, 256, 16), (10, 6, 8, 16), (3, 4, 8, 64)])
def test_moe_align_small_equals_the_sorting_version(tokens, top_k, experts, block_m):
    """The one-program layout is the torch version's: experts in order, each run padded to block_m,
    pairs in index order within an expert; ids == experts (held by another rank) are left out."""
    g = torch.Generator().manual_seed(tokens * 100 + top_k)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    if tokens > 1:
        ids[1, 0] = ids[0, 0]  # a shared expert across tokens
    flat = ids.reshape(-1).to(DEVICE)
    want_pairs, want_blocks = moe_align(ids.cpu(), experts, block_m)
    max_blocks = want_blocks.numel()
    pairs, blocks = moe_align_small(flat, experts, block_m, max_blocks)
    assert blocks.cpu().tolist() == want_blocks.tolist()
    assert pairs.cpu().tolist() == want_pairs.tolist()
    foreign = flat.clone()
    foreign[-1] = experts
    f_pairs, f_blocks = moe_align_small(foreign, experts, block_m, max_blocks)
    ref_pairs, ref_blocks = moe_align(foreign.cpu().view(tokens, top_k), experts, block_m)
    used = [b for b, e in enumerate(ref_blocks.tolist()) if e >= 0]
    assert f_blocks.cpu().tolist() == ref_blocks.tolist()
    for b in used:
        assert f_pairs[b * block_m : (b + 1) * block_m].cpu().tolist() == ref_pairs[b * block_m : (b + 1) * block_m].tolist()


def _align_ids(tokens: int, top_k: int, experts: int, kind: str) -> torch.Tensor:
    """[tokens, top_k] ids: the router's (distinct experts per token), a third of them foreign (id
    `experts`, held by another rank), all on the last expert, or every expert in turn."""
    g = torch.Generator().manual_seed(tokens * 1000 + top_k * 10 + experts)
    n = tokens * top_k
    if kind == "one":
        return torch.full((tokens, top_k), experts - 1)
    if kind == "every":
        return (torch.arange(n) % experts).view(tokens, top_k)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    if kind == "foreign":
        ids = torch.where(torch.rand(tokens, top_k, generator=g) < 1 / 3, experts, ids)
    return ids


@pytest.mark.parametrize(
    "tokens,top_k,experts,block_m,kind",
    [(11, 6, 256, 8, "router"), (65, 1, 256, 16, "router"), (25, 4, 16, 16, "foreign"), (50, 2, 7, 64, "every"),
     (64, 6, 256, 8, "router"), (64, 6, 256, 16, "foreign"), (85, 6, 7, 64, "router"), (85, 6, 16, 32, "foreign"),
     (511, 1, 16, 64, "one"), (511, 1, 7, 8, "foreign"), (128, 4, 7, 8, "every"), (64, 8, 256, 16, "one"),
     (64, 8, 256, 32, "foreign")],
)  # fmt: skip
def test_moe_align_sorted_equals_the_torch_path(tokens, top_k, experts, block_m, kind):
    """The one-program sort (65 to 512 pairs) lays the pairs out as moe_align's torch launches do, bit for
    bit: experts in order, pairs in index order within an expert, runs padded to block_m with n_pairs,
    foreign ids (== experts) in a last run whose blocks are -1, and -1 past the last block."""
    ids = _align_ids(tokens, top_k, experts, kind)
    n = ids.numel()
    max_blocks = align_blocks(n, experts, block_m)
    want_pairs, want_blocks = _moe_align_torch(ids.reshape(-1), experts, block_m, max_blocks)
    pairs, blocks = moe_align_sorted(ids.reshape(-1).to(DEVICE), experts, block_m, max_blocks)
    assert torch.equal(blocks.cpu(), want_blocks)
    assert torch.equal(pairs.cpu(), want_pairs)


def test_moe_align_takes_one_program_up_to_sort_align_pairs():
    """On the GPU moe_align aligns up to SMALL_ALIGN_PAIRS pairs with the [P, P] program, up to
    SORT_ALIGN_PAIRS (decode batches to 85 tokens at top-6) with the sort, and past it in torch."""
    assert SMALL_ALIGN_PAIRS == 64 and SORT_ALIGN_PAIRS == 512
    assert one_program_align(0, 256) is None
    assert all(one_program_align(n, 256) is moe_align_small for n in (1, 6, SMALL_ALIGN_PAIRS))
    assert all(one_program_align(n, e) is moe_align_sorted for n in (65, 384, 512) for e in (2, 256, 4096))
    assert one_program_align(SORT_ALIGN_PAIRS + 1, 256) is None
    assert one_program_align(100, 2**21) is None  # ids the int32 sort keys cannot hold
    with pytest.raises(ValueError, match="at most 512 pairs"):
        moe_align_sorted(torch.zeros(SORT_ALIGN_PAIRS + 1, dtype=torch.int64), 8, 16, 600)


def test_token_chunks_split_evenly_within_the_cap():
    # Against a brute force over every split: the fewest chunks of at most cap rows, covering the
    # rows in order, the shortest as long as can be (no short remainder chunk, e.g. of a mixed step's
    # decode riders, which would stream the experts once more for a few tokens).
    for max_tokens in (3, 8, 64, 4096):
        cap = chunk_cap(max_tokens)
        assert max_tokens <= cap <= max_tokens * 9 // 8
        for t in list(range(1, 3 * cap + 2)) if max_tokens < 100 else (4096, 4097, 8192, 8224, 8192 + 256, 9300, 12289):
            got = token_chunks(t, max_tokens)
            assert [a for a, _ in got] == [0] + [b for _, b in got[:-1]] and got[-1][1] == t
            fewest = -(-t // cap)
            assert all(0 < b - a <= cap for a, b in got)
            if cap < 4 * CHUNK_ALIGN:  # rows as they come: the best shortest chunk for that count
                assert len(got) == fewest and min(b - a for a, b in got) == t // fewest
            else:  # whole units of CHUNK_ALIGN rows, as even as those allow (the remainder last); one
                # chunk more only within CHUNK_ALIGN rows a chunk of the fewest count's cap
                assert len(got) == fewest or (len(got) == fewest + 1 and t > fewest * (cap - CHUNK_ALIGN))
                assert all(a % CHUNK_ALIGN == 0 for a, _ in got)
                units = [(b - a) // CHUNK_ALIGN for a, b in got]
                assert max(units) - min(units) <= 1
    assert token_chunks(8192 + 32, 4096) == [(0, 4112), (4112, 8224)]
    assert token_chunks(8193, 4096) == [(0, 4096), (4096, 8193)]  # cut evenly: a chunk from row 4097
