"""The dMel audio embedding: one 50 ms frame of 80 quantised log-mel bands -> one `hidden_size` token.

Each band m has its own `mel_vocab_size` rows of one table (`model.audio.encoder.weight`,
[80 * V, H]); a frame's embedding is the sum over bands of row m * V + bin[m], then RMSNorm
(`model.audio.final_norm.weight`).
"""

from __future__ import annotations

import torch
from torch import nn

from sgl_inkling.models.inkling.norm import RMSNorm

_NORM_EPS = 1e-6


class InklingAudio(nn.Module):
    def __init__(self, raw: dict, hidden_size: int):
        super().__init__()
        self.n_mel_bins = int(raw.get("n_mel_bins", 80))
        self.mel_vocab_size = int(raw.get("mel_vocab_size", 256))
        self.encoder = nn.Embedding(self.n_mel_bins * self.mel_vocab_size, hidden_size)
        self.final_norm = RMSNorm(hidden_size, _NORM_EPS)

    def forward(self, bins: torch.Tensor) -> torch.Tensor:
        """bins [T, n_mel_bins] integers in [0, mel_vocab_size) -> [T, hidden_size]."""
        offsets = torch.arange(self.n_mel_bins, device=bins.device) * self.mel_vocab_size
        rows = self.encoder(bins.to(device=offsets.device, dtype=torch.long) + offsets)
        return self.final_norm(rows.sum(dim=-2))
