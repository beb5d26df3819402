"""Decode output conv + residual add (+ RMSNorm) in one kernel vs the short-conv and add+norm torch
references: outputs and conv state."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels.rmsnorm import rmsnorm_ref  # noqa: E402
from sgl_inkling_kernels.sconv import sconv_ref  # noqa: E402
from sgl_inkling_kernels.sconv_norm import (  # noqa: E402
    block_c,
    sconv_add_decode,
    sconv_add_rmsnorm_decode,
    sconv_add_rmsnorm_decode_ref,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
CHANNELS = [6144, 1000] if CUDA else [64, 200]  # 200: several channel blocks and a ragged last one
EXTEND_CHANNELS = CHANNELS if CUDA else [*CHANNELS, 6144]  # the extend form's walk at the real hidden size too
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}  # bf16: the conv, the add and the norm each round


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [True, False])
def test_matches_reference(c, dtype, norm):
    g = torch.Generator().manual_seed(c + norm)
    bsz, slots = 3, 6
    conv = (0.3 * torch.randn(c, 1, 4, generator=g)).to(DEVICE)
    state = torch.randn(slots, 3, c, generator=g).to(DEVICE)
    rows = torch.tensor([4, 0, 3], device=DEVICE)
    x = (2.0 * torch.randn(bsz, c, generator=g)).to(DEVICE, dtype)
    res = torch.randn(bsz, c, generator=g).to(DEVICE, dtype)
    norm_w = (1.0 + 0.3 * torch.randn(c, generator=g)).to(DEVICE, dtype) if norm else None
    ref_state = state.clone()
    want_n, want_s = sconv_add_rmsnorm_decode_ref(x, conv, ref_state, rows, res, norm_w, 1e-6)
    if norm:
        got_n, got_s = sconv_add_rmsnorm_decode(x, conv, state, rows, res, norm_w, 1e-6)
        torch.testing.assert_close(got_n.float(), want_n.float(), atol=TOL[dtype], rtol=TOL[dtype])
    else:
        got_s = sconv_add_decode(x, conv, state, rows, res)
    torch.testing.assert_close(got_s.float(), want_s.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(state, ref_state, atol=0, rtol=0)  # rows outside the batch untouched too
    # The conv ran: the sum is not the plain residual add.
    assert ((got_s.float() - (res + x).float()).abs().max()) > 0.1


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("norm", [True, False])
def test_channel_split(c, norm):
    """Several tokens, channels split over several programs with a ragged last block: each block's
    conv, state shift and sum of squares, and a norm over the whole row (the blocks' magnitudes
    differ widely, so a norm from any one block's partial, or a partial summed twice or missed,
    would be far off). fp32, so the outputs match the references to 1e-5; run twice, the same bits."""
    ragged = [w for w in CHANNELS if w % block_c() and -(-w // block_c()) >= 3]
    assert ragged, "some case must span several blocks, the last ragged"
    g = torch.Generator().manual_seed(7 * c + norm)
    bsz, slots, k = 5, 9, 4
    conv = (0.3 * torch.randn(c, 1, k, generator=g)).to(DEVICE)
    state = torch.randn(slots, k - 1, c, generator=g).to(DEVICE)
    rows = torch.tensor([7, 2, 0, 5, 8], device=DEVICE)  # slots 1, 3, 4, 6 not in the batch
    scale = torch.logspace(-1, 1, c).to(DEVICE)  # channel magnitudes from 0.1 to 10
    # Row strides other than C (views into wider buffers): the kernels take the strides.
    x = (2.0 * torch.randn(bsz, c + 8, generator=g)).to(DEVICE)[:, 3 : 3 + c]
    res = (torch.randn(bsz, 2 * c, generator=g).to(DEVICE) * scale.repeat(2))[:, :c]
    norm_w = (1.0 + 0.3 * torch.randn(c, generator=g)).to(DEVICE) if norm else None
    ref_state = state.clone()
    want_n, want_s = sconv_add_rmsnorm_decode_ref(x, conv, ref_state, rows, res, norm_w, 1e-6)

    def run(st):
        if norm:
            return sconv_add_rmsnorm_decode(x, conv, st, rows, res, norm_w, 1e-6)
        return None, sconv_add_decode(x, conv, st, rows, res)

    state2 = state.clone()
    got_n, got_s = run(state)
    torch.testing.assert_close(got_s, want_s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, ref_state, atol=0, rtol=0)  # every block shifted, other rows untouched
    if norm:
        torch.testing.assert_close(got_n, want_n, atol=1e-5, rtol=1e-5)
        # The row's scale is the whole row's: per-token RMS of the output / gain is 1.
        rms = (got_n / norm_w).pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-4, rtol=1e-4)
    again_n, again_s = run(state2)
    assert torch.equal(again_s, got_s) and torch.equal(state2, state)
    if norm:
        assert torch.equal(again_n, got_n)  # the partials are summed in a fixed order


def test_empty_batch():
    c = max(CHANNELS)
    conv = torch.randn(c, 1, 4).to(DEVICE)
    state = torch.randn(2, 3, c).to(DEVICE)
    before = state.clone()
    x = torch.empty(0, c, device=DEVICE)
    rows = torch.empty(0, dtype=torch.long, device=DEVICE)
    normed, summed = sconv_add_rmsnorm_decode(x, conv, state, rows, x, torch.ones(c, device=DEVICE), 1e-6)
    assert normed.shape == summed.shape == (0, c)
    assert sconv_add_decode(x, conv, state, rows, x).shape == (0, c)
    assert torch.equal(state, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_slots_summed_in_the_conv_launch(dtype):
    """A MoE's unsummed slots (moe_slots.UnsummedSlots: top-6 routed + 2 sink slots, some routed to a
    foreign expert whose rows hold garbage) go into the FFN output conv, which sums them: the same bits as
    summing them first (sum_slots) and conv'ing the rows, and within rounding of a torch sum written here
    (the live slots in fp32, rounded to the dtype) through the short-conv reference."""
    from sgl_inkling_kernels.moe_slots import UnsummedSlots, sum_slots

    c, bsz, k, n_sink, n_exp = max(CHANNELS), 4, 6, 2, 256
    g = torch.Generator().manual_seed(11)
    out = torch.randn(bsz, k + n_sink, c, generator=g).to(DEVICE)
    ids = torch.randint(0, n_exp, (bsz, k), generator=g)
    ids[0, 2] = ids[3, 0] = ids[3, 5] = n_exp  # foreign: never written by the experts' kernels
    out[0, 2] = out[3, 0] = out[3, 5] = float("nan")
    ids = ids.to(DEVICE)
    slots = UnsummedSlots(out, ids, n_exp, dtype)
    conv = (0.3 * torch.randn(c, 1, 4, generator=g)).to(DEVICE)
    state = torch.randn(6, 3, c, generator=g).to(DEVICE)
    rows = torch.tensor([4, 0, 3, 5], device=DEVICE)
    res = torch.randn(bsz, c, generator=g).to(DEVICE, dtype)

    live = torch.cat([ids < n_exp, torch.ones(bsz, n_sink, dtype=torch.bool, device=DEVICE)], 1)
    summed_rows = torch.where(live[..., None], out, 0.0).sum(1).to(dtype)
    ref_state = state.clone()
    _, want = sconv_add_rmsnorm_decode_ref(summed_rows, conv, ref_state, rows, res, None, 1e-6)

    first_state = state.clone()
    rows_first = sum_slots(slots)
    torch.testing.assert_close(rows_first.float(), summed_rows.float(), atol=TOL[dtype], rtol=TOL[dtype])
    first = sconv_add_decode(rows_first, conv, first_state, rows, res)
    got = sconv_add_decode(slots, conv, state, rows, res)
    assert torch.equal(got, first) and torch.equal(state, first_state)
    assert not got.isnan().any()
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(state, ref_state, atol=TOL[dtype], rtol=TOL[dtype])
    # With the next norm (the next layer's attn_norm, chained into this launch): the same bits as the rows.
    norm_w = (1.0 + 0.3 * torch.randn(c, generator=g)).to(DEVICE, dtype)
    st_rows, st_slots = state.clone(), state.clone()
    want_n, want_s = sconv_add_rmsnorm_decode(rows_first, conv, st_rows, rows, res, norm_w, 1e-6)
    got_n, got_s = sconv_add_rmsnorm_decode(slots, conv, st_slots, rows, res, norm_w, 1e-6)
    assert torch.equal(got_n, want_n) and torch.equal(got_s, want_s) and torch.equal(st_slots, st_rows)
    with pytest.raises(ValueError, match="slots summed to"):
        sconv_add_decode(UnsummedSlots(out, ids, n_exp, torch.float16), conv, state, rows, res)


# A ragged batch of short extends as MTP's verify and draft depths bring them (and a fresh one-token
# sequence, whose conv starts from zeros whatever its slot holds): tokens a sequence, cached prefix, row.
EXTEND_LENS, EXTEND_PREFIX, EXTEND_ROWS = [3, 1, 5], [7, 0, 2], [4, 0, 3]


def _windows(x: torch.Tensor, state: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each sequence's conv window (its prior state, zeros when fresh, then its inputs), from the lists above."""
    out, at = {}, 0
    for n, prefix, row in zip(EXTEND_LENS, EXTEND_PREFIX, EXTEND_ROWS):
        prior = state[row] if prefix > 0 else torch.zeros_like(state[row])
        out[row] = torch.cat([prior, x[at : at + n].float()])
        at += n
    return out


@pytest.mark.parametrize("c", EXTEND_CHANNELS)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("capture", [True, False])
def test_extend_matches_reference_and_captures_windows(c, norm, capture):
    """The extend form vs the short-conv reference over each sequence, then the add (+ norm): rows,
    states (exact: they hold the inputs, fp32) and, capturing, each sequence's window as written here
    (its other rows, and other sequences' rows, left as they were)."""
    from sgl_inkling_kernels.sconv_norm import sconv_add_rmsnorm_extend

    g = torch.Generator().manual_seed(3 * c + 2 * norm + capture)
    t, slots, k = sum(EXTEND_LENS), 6, 4
    conv = (0.3 * torch.randn(c, 1, k, generator=g)).to(DEVICE)
    state = torch.randn(slots, k - 1, c, generator=g).to(DEVICE)
    x = (2.0 * torch.randn(t, c, generator=g)).to(DEVICE)
    res = torch.randn(t, c, generator=g).to(DEVICE)
    norm_w = (1.0 + 0.3 * torch.randn(c, generator=g)).to(DEVICE) if norm else None
    rows, prefix, lens = (torch.tensor(v, device=DEVICE) for v in (EXTEND_ROWS, EXTEND_PREFIX, EXTEND_LENS))
    starts = torch.cumsum(lens, 0) - lens
    want_windows = _windows(x, state)
    ref_state = state.clone()
    y = sconv_ref(x, conv, ref_state, rows, prefix, lens)
    want_s = res + y
    cap = torch.full((slots, k - 1 + 6, c), -7.0, device=DEVICE) if capture else None
    got_n, got_s = sconv_add_rmsnorm_extend(x, conv, state, rows, prefix, lens, starts, res, norm_w, 1e-6, cap)
    torch.testing.assert_close(got_s, want_s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, ref_state, atol=0, rtol=0)
    if norm:
        torch.testing.assert_close(got_n, rmsnorm_ref(want_s, norm_w, 1e-6), atol=1e-5, rtol=1e-5)
    else:
        assert got_n is None
    if capture:
        for row in range(slots):
            want = torch.full_like(cap[row], -7.0)
            if row in want_windows:
                want[: want_windows[row].shape[0]] = want_windows[row]
            torch.testing.assert_close(cap[row], want, atol=0, rtol=0)


def test_extend_equals_decode_steps_bit_for_bit():
    """A verify's output conv equals the decode steps its tokens would have taken one at a time (the
    decode kernel, same arithmetic): the same bits for the rows, the normed rows and the states. What
    keeps MTP's greedy output the plain decode's on the GPU."""
    from sgl_inkling_kernels.sconv_norm import sconv_add_rmsnorm_extend

    c = max(CHANNELS)
    g = torch.Generator().manual_seed(17)
    lens = [4, 2, 4]
    conv = (0.3 * torch.randn(c, 1, 4, generator=g)).to(DEVICE)
    state = torch.randn(5, 3, c, generator=g).to(DEVICE)
    x = (2.0 * torch.randn(sum(lens), c, generator=g)).to(DEVICE, torch.bfloat16)
    res = torch.randn(sum(lens), c, generator=g).to(DEVICE, torch.bfloat16)
    norm_w = (1.0 + 0.3 * torch.randn(c, generator=g)).to(DEVICE, torch.bfloat16)
    rows = torch.tensor([1, 4, 2], device=DEVICE)
    lens_t = torch.tensor(lens, device=DEVICE)
    step_state = state.clone()
    got_n, got_s = sconv_add_rmsnorm_extend(
        x, conv, state, rows, lens_t, lens_t, torch.cumsum(lens_t, 0) - lens_t, res, norm_w, 1e-6
    )
    starts = [0, 4, 6]
    for j in range(max(lens)):
        seqs = [i for i, n in enumerate(lens) if n > j]
        at = torch.tensor([starts[i] + j for i in seqs], device=DEVICE)
        n_j, s_j = sconv_add_rmsnorm_decode(x[at], conv, step_state, rows[seqs], res[at], norm_w, 1e-6)
        assert torch.equal(got_s[at], s_j) and torch.equal(got_n[at], n_j)
    assert torch.equal(state, step_state)
