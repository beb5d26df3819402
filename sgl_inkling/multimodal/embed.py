"""Scheduler side: the input embeddings of an extend batch with media placeholders in it.

Text positions take the token embedding; placeholder positions take their row of the item's tower
output. Each item is encoded once, at the first chunk that reaches it, and kept on the request until
prefill has passed it, so a media span that straddles chunks is sliced, never re-encoded. (Encoding
here rather than in the HTTP process keeps the towers with the model on its device; encoding lazily
skips items the prefix cache already covers.)
"""

from __future__ import annotations

import torch

from sgl_inkling.multimodal.image import patchify


def _encoded(model, req, idx: int) -> torch.Tensor:
    cache = req.mm_embeds
    if idx not in cache:
        item = req.mm_items[idx]
        device = model.model.llm.embed.weight.device
        data = patchify(item.data) if item.kind == "image" else item.data
        cache[idx] = model.encode_media(item.kind, data.to(device))
    return cache[idx]


def extend_input_embeds(model, chunks: list[tuple[object, int, int]], input_ids: torch.Tensor) -> torch.Tensor | None:
    """`chunks`: (req, first position, token count) in batch order. None when no chunk holds media."""
    if not any(req.mm_items for req, _, _ in chunks):
        return None
    h = model.embed_tokens(input_ids)
    row = 0
    for req, start, n in chunks:
        for idx, item in enumerate(req.mm_items or ()):
            lo, hi = max(start, item.offset), min(start + n, item.offset + item.num_tokens)
            if lo < hi:
                emb = _encoded(model, req, idx)
                h[row + lo - start : row + hi - start] = emb[lo - item.offset : hi - item.offset].to(h.dtype)
            if start + n >= item.offset + item.num_tokens:
                req.mm_embeds.pop(idx, None)  # prefill has passed it (a retraction re-encodes)
        row += n
    return h
