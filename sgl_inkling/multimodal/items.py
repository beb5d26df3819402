"""One image or audio clip of a request, as it travels to the scheduler, and its cache keys."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

_KEY_MASK = (1 << 62) - 1


@dataclass
class MediaItem:
    kind: str  # "image" | "audio"
    # image: upscaled RGB uint8 [H, W, 3]; audio: dMel bins uint8 [frames, 80]
    data: torch.Tensor
    num_tokens: int
    offset: int = -1  # position of its first placeholder token in the prompt
    digest: int = 0

    def __post_init__(self) -> None:
        if not self.digest:
            h = hashlib.sha256(self.kind.encode())
            h.update(repr(tuple(self.data.shape)).encode())
            h.update(self.data.contiguous().numpy().tobytes())
            self.digest = int.from_bytes(h.digest()[:8], "little") & _KEY_MASK

    def keys(self) -> list[int]:
        """Radix-tree keys of its placeholder positions: negative, so never a real token id, and
        derived from the content, so the same media hits the cache and different media does not."""
        return [-1 - ((self.digest + j) & _KEY_MASK) for j in range(self.num_tokens)]


def cache_key(input_ids: list[int], items: list[MediaItem]) -> list[int]:
    """The prompt as the radix tree sees it: placeholder ids replaced by content keys."""
    key = list(input_ids)
    for item in items:
        key[item.offset : item.offset + item.num_tokens] = item.keys()
    return key
