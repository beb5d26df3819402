"""Which drafted tokens the trunk accepts, and the token it adds after them.

Drafts are the argmax of each depth (a point-mass proposal q). For a target distribution p the
rejection rule is then: accept draft x with probability p(x); at the first rejection sample from p
with x removed (renormalised); after the last accepted draft sample from p. Each emitted token is
distributed exactly as p, whatever the drafts were. Greedy rows are the special case where p is
one-hot at the argmax: a draft is accepted iff it is the argmax, and the added token is the argmax.
All of it runs on the device; one transfer brings the decisions to the host.
"""

from __future__ import annotations

import torch

from sgl_inkling.sampling.sampler import sampling_distribution
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo


def accept_drafts(
    logits: torch.Tensor,  # [B, K + 1, V] float, grammar masks applied; row j follows draft j
    drafts: list[list[int]],  # [B][K]
    params: list,  # SamplingParams per request
    limits: list[int],  # most drafts each request may accept (grammar end, fallback rows: 0)
    forced: list[int] | None = None,  # benchmark only: accept exactly this many (capped by limits)
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Per request: the accepted drafts followed by one token from the trunk."""
    b, r, v = logits.shape
    k = r - 1
    flat = logits.reshape(b * r, v)
    draft_t = torch.tensor(drafts, dtype=torch.int64).reshape(b, k).to(logits.device)
    if all(p.is_greedy for p in params) or forced is not None:
        targets = flat.argmax(-1).view(b, r).tolist()
        out = []
        for i in range(b):
            if forced is not None:
                a = min(forced[i], limits[i])
            else:
                a = 0
                while a < limits[i] and drafts[i][a] == targets[i][a]:
                    a += 1
            out.append(list(drafts[i][:a]) + [targets[i][a]])
        return out

    info = SamplingBatchInfo.from_params([p for p in params for _ in range(r)], v, logits.device)
    probs = sampling_distribution(flat, info).view(b, r, v)
    p_draft = probs[:, :k].gather(-1, draft_t[..., None]).squeeze(-1)
    u = torch.rand(b, k, device=logits.device, generator=generator)
    accepted = u < p_draft  # greedy rows: p is one-hot, so exactly when the draft is the argmax
    residual = probs.clone()
    residual[:, :k].scatter_(-1, draft_t[..., None], 0.0)
    # Exponential races draw from unnormalised distributions: argmax(p / E), E ~ Exp(1).
    noise = torch.empty_like(probs).exponential_(generator=generator).clamp_min_(torch.finfo(torch.float32).tiny)
    from_residual = (residual / noise).argmax(-1)
    from_full = (probs / noise).argmax(-1)
    accepted, from_residual, from_full = accepted.tolist(), from_residual.tolist(), from_full.tolist()
    out = []
    for i in range(b):
        a = 0
        while a < limits[i] and accepted[i][a]:
            a += 1
        bonus = from_residual[i][a] if a < limits[i] else from_full[i][a]
        out.append(list(drafts[i][:a]) + [bonus])
    return out
