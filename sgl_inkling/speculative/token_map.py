"""The draft vocabulary of --speculative-token-map, in upstream SGLang's format: a file that
torch.load reads (weights only) into a 1-D list or tensor of token ids, usually the most frequent
ones. A path that is not a local file is read as "<hub repo id>/<file name>" and downloaded."""

from __future__ import annotations

import os

import torch

FLAG = "--speculative-token-map"


def load_token_map(path: str, vocab_size: int) -> torch.Tensor:
    """The token ids as an int64 tensor, validated against the model's (unpadded) vocabulary."""
    if not os.path.isfile(path):
        from huggingface_hub import hf_hub_download

        repo, name = os.path.dirname(path), os.path.basename(path)
        if not repo or not name:
            raise ValueError(f"{FLAG}: {path!r} is neither a file nor <hub repo id>/<file name>")
        try:
            path = hf_hub_download(repo, name)
        except Exception as e:
            raise ValueError(f"{FLAG}: {path!r} is not a local file and could not be downloaded: {e}") from e
    try:
        ids = torch.as_tensor(torch.load(path, weights_only=True))
    except Exception as e:
        raise ValueError(f"{FLAG}: cannot read {path!r} as a torch-saved list of token ids: {e}") from e
    if ids.dim() != 1 or ids.numel() == 0 or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"{FLAG}: expected a non-empty 1-D list of integer token ids, got {tuple(ids.shape)} {ids.dtype}")
    ids = ids.to(torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{FLAG}: token ids must be in 0..{vocab_size - 1}, got {int(ids.min())}..{int(ids.max())}")
    if torch.unique(ids).numel() != ids.numel():
        raise ValueError(f"{FLAG}: token ids repeat")
    return ids
