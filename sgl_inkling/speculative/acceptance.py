"""Which drafted tokens the trunk accepts, and the token it adds after them.

Drafts are the argmax of each depth (a point-mass proposal q). For a target distribution p the
rejection rule is then: accept draft x with probability p(x); at the first rejection sample from p
with x removed (renormalised); after the last accepted draft sample from p. Each emitted token is
distributed exactly as p, whatever the drafts were. Greedy rows are the special case where p is
one-hot at the argmax: a draft is accepted iff it is the argmax, and the added token is the argmax.

Everything here is tensor code on the logits' device with fixed shapes: the greedy rule runs
inside the verify step's CUDA graph, and one transfer (Accepted.to_host) brings the decisions back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_inkling.sampling.sampler import sampling_distribution
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo


@dataclass
class Accepted:
    lengths: torch.Tensor  # [B] drafts accepted
    tokens: torch.Tensor  # [B, K + 1]: the accepted drafts, then the trunk's token at column lengths[i]

    def to_host(self) -> list[list[int]]:
        """Per request: the accepted drafts followed by the trunk's token (one device read)."""
        both = torch.cat([self.lengths[:, None], self.tokens], dim=1).tolist()
        return [row[1 : row[0] + 2] for row in both]


def _emit(ids: torch.Tensor, lengths: torch.Tensor, bonus: torch.Tensor) -> Accepted:
    """ids [B, K + 1] = (pending token, drafts); bonus [B, K + 1] = the trunk's token after each prefix."""
    tokens = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # drafts, then a placeholder column
    tokens.scatter_(1, lengths[:, None], bonus.gather(1, lengths[:, None]))
    return Accepted(lengths, tokens)


def _leading(accepted: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """How many leading drafts are accepted, at most limits[i]."""
    return torch.minimum(accepted.to(torch.int64).cumprod(-1).sum(-1), limits)


def greedy_accept(
    logits: torch.Tensor,  # [B, K + 1, V] row j follows draft j
    ids: torch.Tensor,  # [B, K + 1] the verified tokens: pending, then the drafts
    limits: torch.Tensor,  # [B] most drafts each request may accept (grammar end, fallback rows: 0)
    forced: torch.Tensor | None = None,  # [B] benchmark only: accept this many (capped by limits), or -1
) -> Accepted:
    targets = logits.argmax(-1)
    lengths = _leading(ids[:, 1:] == targets[:, :-1], limits)
    if forced is not None:
        lengths = torch.where(forced >= 0, torch.minimum(forced, limits), lengths)
    return _emit(ids, lengths, targets)


def sample_accept(
    logits: torch.Tensor,  # [B, K + 1, V] float, grammar masks applied
    ids: torch.Tensor,
    params: list,  # SamplingParams per request
    limits: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Accepted:
    """Rejection sampling with point-mass drafts; greedy rows in the batch come out greedy."""
    b, r, v = logits.shape
    k = r - 1
    drafts = ids[:, 1:]
    info = SamplingBatchInfo.from_params([p for p in params for _ in range(r)], v, logits.device)
    probs = sampling_distribution(logits.reshape(b * r, v), info).view(b, r, v)
    p_draft = probs[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.rand(b, k, device=logits.device, generator=generator)
    lengths = _leading(u < p_draft, limits)  # greedy rows: p is one-hot, so exactly the argmax test
    residual = probs.clone()
    residual[:, :k].scatter_(-1, drafts[..., None], 0.0)
    # Exponential races draw from unnormalised distributions: argmax(p / E), E ~ Exp(1).
    noise = torch.empty_like(probs).exponential_(generator=generator).clamp_min_(torch.finfo(torch.float32).tiny)
    from_residual = (residual / noise).argmax(-1)
    from_full = (probs / noise).argmax(-1)
    # Stopped early at a rejected draft: the residual; ran out of drafts it may accept: the full p.
    stopped = (lengths < limits)[:, None]
    return _emit(ids, lengths, torch.where(stopped, from_residual, from_full))
