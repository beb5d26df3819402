"""The hMLP vision encoder: one 40x40x2 patch in, one `hidden_size` token out.

A ladder of steps, each folding space (and, last, time) into channels, then Linear; every step but
the last adds RMSNorm + GELU; a final RMSNorm. The ladder's shapes come from `plan_scales`, which
follows the transformers port's `plan_out_scales` (the checkpoint's tensor shapes depend on it).
Hub names: `model.visual.layers.linear_{i}.weight`, `model.visual.layers.norm_{i}.weight`,
`model.visual.final_norm.weight`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sgl_inkling.layers.linear import Linear
from sgl_inkling.models.inkling.norm import RMSNorm

_NORM_EPS = 1e-6


@dataclass(frozen=True)
class VisionConfig:
    patch_size: int = 40
    temporal_patch_size: int = 2
    num_channels: int = 3
    num_layers: int = 24

    @classmethod
    def from_dict(cls, d: dict) -> VisionConfig:
        layers = d.get("n_layers", d.get("num_hidden_layers", cls.num_layers))
        return cls(
            patch_size=int(d.get("patch_size", cls.patch_size)),
            temporal_patch_size=int(d.get("temporal_patch_size", cls.temporal_patch_size)),
            num_channels=int(d.get("num_channels", cls.num_channels)),
            num_layers=int(layers),
        )


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def plan_scales(cfg: VisionConfig) -> list[tuple[int, int, int]]:
    """(time fold, space fold, channels) reached after each step, step 0 being the raw pixels.

    Candidate scales grow space first (by the patch size's prime factors, largest first), then
    time; each step takes the candidate whose log size is nearest an even split of the patch's log
    size: per step when there are at least as many steps as candidates, else as a one-to-one
    assignment of minimal total distance. The first and last scales are pinned.
    """
    c = cfg.num_channels
    hs = list(itertools.accumulate(_prime_factors(cfg.patch_size)[::-1], lambda a, b: a * b))
    ts = list(itertools.accumulate(_prime_factors(cfg.temporal_patch_size)[::-1], lambda a, b: a * b))
    h = hs[-1]
    scales = [(1, 1, c)]
    scales += [(1, s, math.ceil(s * s * c / 64) * 64) for s in hs]
    # Channel count of the time-folded scales as the port computes it (never an output width in
    # practice: only the last step reaches them, and it projects to hidden_size).
    scales += [(t, h, math.ceil(h * h * c * t) * 64) for t in ts]
    sizes = [math.log(t * s * s) for t, s, _ in scales]
    total = math.log(cfg.patch_size**2 * cfg.temporal_patch_size * c)
    n = cfg.num_layers
    ideal = [total * i / n for i in range(n + 1)]
    if n >= len(scales):
        idx = [min(range(len(scales)), key=lambda j, x=x: abs(x - sizes[j])) for x in ideal]
    else:
        # n + 1 points, len(scales) candidates: brute force is tiny here (at most 6! orderings).
        best = min(
            itertools.permutations(range(len(scales)), n + 1),
            key=lambda p: sum(abs(ideal[i] - sizes[j]) for i, j in enumerate(p)),
        )
        idx = list(best)
    idx[0], idx[-1] = 0, len(scales) - 1
    return [scales[j] for j in idx]


def fold(x: torch.Tensor, tf: int, sf: int) -> torch.Tensor:
    """[B, T, H, W, C] -> [B, T/tf, H/sf, W/sf, tf*sf*sf*C], channels ordered (t, h, w, C)."""
    if tf == 1 and sf == 1:
        return x
    b, t, h, w, c = x.shape
    x = x.reshape(b, t // tf, tf, h // sf, sf, w // sf, sf, c).permute(0, 1, 3, 5, 2, 4, 6, 7)
    return x.reshape(b, t // tf, h // sf, w // sf, tf * sf * sf * c)


class InklingVision(nn.Module):
    """pixels [N, T, P, P, C] (CLIP-normalised, T = temporal_patch_size) -> [N, hidden_size]."""

    def __init__(self, raw: dict, hidden_size: int):
        super().__init__()
        self.cfg = VisionConfig.from_dict(raw)
        scales = plan_scales(self.cfg)
        self.folds: list[tuple[int, int]] = []
        self.layers = nn.ModuleDict()
        n = len(scales) - 1
        for i, (a, b) in enumerate(zip(scales[:-1], scales[1:])):
            tf, sf = b[0] // a[0], b[1] // a[1]
            self.folds.append((tf, sf))
            out = hidden_size if i == n - 1 else b[2]
            self.layers[f"linear_{i}"] = Linear(a[2] * tf * sf * sf, out)
            if i < n - 1:
                self.layers[f"norm_{i}"] = RMSNorm(out, _NORM_EPS)
        self.final_norm = RMSNorm(hidden_size, _NORM_EPS)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.to(self.final_norm.weight.dtype)
        last = len(self.folds) - 1
        for i, (tf, sf) in enumerate(self.folds):
            x = self.layers[f"linear_{i}"](fold(x, tf, sf))
            if i < last:
                x = F.gelu(self.layers[f"norm_{i}"](x))
        return self.final_norm(x).reshape(pixels.shape[0], -1)
