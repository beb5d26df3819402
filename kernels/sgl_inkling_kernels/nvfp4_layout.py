"""The "mma" code layout of NVFP4 experts: each 32-bit word of 8 codes rearranged bit by bit so that
the W4A16 decode kernels expand it into bf16 pairs in 8 integer instructions instead of 14.

A decoded bf16 pair (e2m1 * 2^-126 in each lane, nvfp4_decode's trick) needs a code's 3 magnitude
bits at lane bits 6-8 and its sign at bit 15, lanes 16 bits apart: the mask M = 0x81C081C0. In the
checkpoint's layout a nibble's sign sits next to its magnitude, so each pair costs two shifted
copies, masks and a byte permute. Here the bits of elements (e0, e1), (e2, e3), (e4, e5) are placed
so that one rotation lines a pair up under M (rotations 0, 3 and 6 of the word), and (e6, e7) fill
the 8 bits left, which one multiply by 2^3 + 2^8 + 2^14 of the word masked to them moves under M
(no two shifted bits collide, so the sum is an or). Per word:

    (e0, e1) = w & M;  (e2, e3) = rotr(w, 3) & M;  (e4, e5) = rotr(w, 6) & M;
    (e6, e7) = ((w & 0x001B001B) * 0x4108) & M

Lane 0 of a pair is its even element, so the pairs line up with the activations' own bf16 pairs
(elements 2i, 2i + 1 of a 32-bit word): the MMA B fragments need no permute either.

Only the order of bits inside each 4-byte word changes: shapes, the 16-wide scale blocks (a word is
half a block) and the split of rows and columns under TP / EP stay the checkpoint's, so the loader
slices first and converts after (to_mma_layout), on the device, once.
"""

from __future__ import annotations

import torch

LAYOUTS = ("checkpoint", "mma")
PAIR_MASK = 0x81C081C0

# Where bit b (0-2 magnitude, 3 sign) of element e's code lands in the word: lane l of pair p = e // 2
# reads magnitude bits 6-8 and sign 15 of its 16-bit lane (plus 16 l) after the pair's move above.
_DEST = (
    (6, 7, 8, 15), (22, 23, 24, 31),  # e0, e1: in place
    (9, 10, 11, 18), (25, 26, 27, 2),  # e2, e3: 3 above (mod 32)
    (12, 13, 14, 21), (28, 29, 30, 5),  # e4, e5: 6 above (mod 32)
    (3, 4, 0, 1), (19, 20, 16, 17),  # e6, e7: shifted up by 3 (magnitude bits 0, 1), 8 (bit 2), 14 (sign)
)  # fmt: skip
_MOVES = [(4 * e + b, d) for e, dest in enumerate(_DEST) for b, d in enumerate(dest)]
assert sorted(d for _, d in _MOVES) == list(range(32))


def _by_rotation(moves: list[tuple[int, int]]) -> dict[int, int]:
    """{left rotation: mask of destination bits} moving bit s to d for every (s, d)."""
    rot: dict[int, int] = {}
    for s, d in moves:
        r = (d - s) % 32
        rot[r] = rot.get(r, 0) | (1 << d)
    return rot


_TO_MMA = _by_rotation(_MOVES)
_TO_CHECKPOINT = _by_rotation([(d, s) for s, d in _MOVES])


def _permute_words(codes: torch.Tensor, rotations: dict[int, int], chunk_rows: int, inplace: bool) -> torch.Tensor:
    if codes.dtype != torch.uint8 or codes.shape[-1] % 4:
        raise ValueError(f"NVFP4 codes must be uint8 with whole 4-byte words per row, got {codes.dtype} "
                         f"{list(codes.shape)}")  # fmt: skip
    if inplace and not codes.is_contiguous():
        raise ValueError("NVFP4 codes converted in place must be contiguous")
    flat = codes.contiguous().view(-1, codes.shape[-1])
    out = flat if inplace else torch.empty_like(flat)  # each chunk is read whole before it is written
    for r0 in range(0, flat.shape[0], chunk_rows):  # bounded temporaries on multi-GB expert tensors
        w = flat[r0 : r0 + chunk_rows].view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        acc = torch.zeros_like(w)
        for r, mask in rotations.items():
            acc |= (((w << r) | (w >> (32 - r))) if r else w) & mask
        out[r0 : r0 + chunk_rows].view(torch.int32).copy_(torch.where(acc >= 1 << 31, acc - (1 << 32), acc))
    return out.view(codes.shape)


def to_mma_layout(codes: torch.Tensor, chunk_rows: int = 4096, inplace: bool = False) -> torch.Tensor:
    """uint8 codes `[..., rows, cols / 2]` in the checkpoint layout -> the same shape in the mma layout
    (inplace: into codes itself, so that loading a model needs no second copy of its experts)."""
    return _permute_words(codes, _TO_MMA, chunk_rows, inplace)


def to_checkpoint_layout(codes: torch.Tensor, chunk_rows: int = 4096, inplace: bool = False) -> torch.Tensor:
    """The inverse of to_mma_layout."""
    return _permute_words(codes, _TO_CHECKPOINT, chunk_rows, inplace)


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"NVFP4 code layout must be one of {LAYOUTS}, got {layout!r}")
    return layout
