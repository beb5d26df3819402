"""The mma code layout (nvfp4_layout) against the decode the W4A16 kernels run on it, written here in
plain Python integers: pair p of a word is w & M, rotr(w, 3) & M, rotr(w, 6) & M or
((w & 0x001B001B) * 0x4108) & M (M = 0x81C081C0), lane l of a pair holds a code's magnitude at bits
16 l + 6..8 and its sign at 16 l + 15. Every element must come out as the e2m1 value of its
checkpoint nibble (element e of a little-endian word = nibble e), looked up in a table here.
"""

from __future__ import annotations

import pytest
import torch

from sgl_inkling_kernels.nvfp4_layout import to_checkpoint_layout, to_mma_layout

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
M = 0x81C081C0


def _rotr(w: int, s: int) -> int:
    return ((w >> s) | (w << (32 - s))) & 0xFFFFFFFF


def _kernel_decode(word: int) -> list[float]:
    """The 8 elements (pairs in order, lane 0 first) as the kernels' bit decode gives them."""
    pairs = [word & M, _rotr(word, 3) & M, _rotr(word, 6) & M, ((word & 0x001B001B) * 0x4108) & M]
    out = []
    for p in pairs:
        for lane in (0, 1):
            mag = (p >> (16 * lane + 6)) & 7
            sign = (p >> (16 * lane + 15)) & 1
            out.append(E2M1[mag | sign << 3])
    return out


def _words(t: torch.Tensor) -> list[int]:
    return [int.from_bytes(bytes(t[i : i + 4].tolist()), "little") for i in range(0, t.numel(), 4)]


def _codes_with_every_nibble_everywhere(n_random: int = 512) -> torch.Tensor:
    """Words where each element takes each of the 16 codes (the others random), then random words."""
    g = torch.Generator().manual_seed(3)
    words = []
    for e in range(8):
        for code in range(16):
            w = int(torch.randint(0, 2**32, (1,), generator=g, dtype=torch.int64))
            words.append((w & ~(15 << 4 * e)) | code << 4 * e)
    words += torch.randint(0, 2**32, (n_random,), generator=g, dtype=torch.int64).tolist()
    return torch.tensor([b for w in words for b in w.to_bytes(4, "little")], dtype=torch.uint8)


def test_kernel_decode_of_the_mma_layout_gives_every_checkpoint_code():
    codes = _codes_with_every_nibble_everywhere()
    mma = to_mma_layout(codes.view(1, -1)).view(-1)
    for ck, w in zip(_words(codes), _words(mma)):
        want = [E2M1[(ck >> 4 * e) & 15] for e in range(8)]
        got = _kernel_decode(w)
        assert [(v, str(v)[0] == "-") for v in got] == [(v, str(v)[0] == "-") for v in want], (hex(ck), hex(w))


def test_round_trip_in_place_and_in_chunks():
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 256, (3, 7, 40), generator=g, dtype=torch.uint8)
    mma = to_mma_layout(codes, chunk_rows=2)
    assert mma.shape == codes.shape and not torch.equal(mma, codes)
    assert torch.equal(to_checkpoint_layout(mma), codes)
    inplace = codes.clone()
    assert to_mma_layout(inplace, chunk_rows=5, inplace=True).data_ptr() == inplace.data_ptr()
    assert torch.equal(inplace, mma)


def test_refuses_what_is_not_whole_code_words():
    with pytest.raises(ValueError, match="4-byte words"):
        to_mma_layout(torch.zeros(2, 6, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        to_mma_layout(torch.zeros(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        to_mma_layout(torch.zeros(8, 8, dtype=torch.uint8)[:, :4], inplace=True)
