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

from sgl_inkling.sampling.sampler import TOPK_CANDIDATES, prefix_threshold
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


@dataclass
class RowParams:
    """Per-request sampling tensors [B] on the logits' device (SamplingBatchInfo's conventions: greedy
    rows carry temperature 1; top_ks holds the vocabulary size where top-k is off)."""

    temperatures: torch.Tensor  # float32
    top_ks: torch.Tensor  # int64
    top_ps: torch.Tensor  # float32
    min_ps: torch.Tensor  # float32
    is_greedy: torch.Tensor  # bool

    FIELDS = ("temperatures", "top_ks", "top_ps", "min_ps", "is_greedy")

    @classmethod
    def of(cls, info: SamplingBatchInfo) -> RowParams:
        return cls(*(getattr(info, f) for f in cls.FIELDS))


def filter_width(params: list, vocab: int) -> int:
    """How many of each row's most probable tokens the top-k / top-p thresholds need (host flags):
    0 when no sampled row filters, TOPK_CANDIDATES (topk) when every filtering row's boundary lies
    among them, else the whole vocabulary (a full sort), as the plain sampler decides per row."""
    width = min(TOPK_CANDIDATES, vocab)
    need = wide = False
    for p in params:
        k = vocab if p.top_k < 0 else min(p.top_k, vocab)
        if p.is_greedy or (k >= vocab and p.top_p >= 1.0):
            continue
        need, wide = True, wide or k > width
    return vocab if wide else width if need else 0


def kept_distribution(logits: torch.Tensor, rows: RowParams, width: int) -> torch.Tensor:
    """sampler.sampling_distribution from per-row tensors alone (no host flags, no per-row host
    loops), so it can be captured: logits [N, V] -> renormalised probabilities float32 [N, V].
    min-p always runs (0 keeps every token); width (static) is filter_width's: 0 skips top-k/top-p."""
    # A softmax in place on the one new buffer (float32 whatever the logits' dtype): torch.softmax
    # would hold its input and its output at once, a third [N, V] float32 next to the noise.
    probs = logits / rows.temperatures[:, None].float()
    probs.sub_(probs.amax(dim=-1, keepdim=True)).exp_()
    probs.div_(probs.sum(dim=-1, keepdim=True))
    threshold = rows.min_ps * probs.amax(dim=-1)
    if width:
        vocab = probs.shape[-1]
        vals = probs.topk(width, dim=-1).values if width < vocab else probs.sort(dim=-1, descending=True).values
        threshold = torch.maximum(threshold, prefix_threshold(vals, rows.top_ks, rows.top_ps, vocab))
    probs.masked_fill_(probs < threshold[:, None], 0.0)
    probs.div_(probs.sum(dim=-1, keepdim=True))
    # Greedy rows: one-hot at the argmax of the raw logits (lowest id on ties, as greedy_accept).
    top = logits.argmax(dim=-1, keepdim=True)
    greedy = rows.is_greedy[:, None]
    probs.masked_fill_(greedy, 0.0)
    return probs.scatter_(1, top, torch.where(greedy, 1.0, probs.gather(1, top)))


def sampled_accept(
    logits: torch.Tensor,  # [B, K + 1, V], grammar masks applied
    ids: torch.Tensor,  # [B, K + 1]
    rows: RowParams,  # [B] per request
    limits: torch.Tensor,  # [B]
    width: int,  # filter_width of the batch (static inside a graph)
    generator: torch.Generator | None = None,
) -> Accepted:
    """Rejection sampling with point-mass drafts from tensors only: the eager rule (sample_accept)
    and the verify graph's sampled rule. Greedy rows come out exactly greedy: their p is one-hot.

    Temporaries beyond the logits: one float32 [B, K + 1, V] for the probabilities and one for the
    noise, alive together (SAMPLED_BYTES_PER_LOGIT in verify_graphs.py); the races for the full p
    and the residual share the noise and run in its buffer. The draw order (u, then one Exp(1) per
    logit) is fixed, so the same generator state gives the same decisions on either path."""
    b, r, v = logits.shape
    k = r - 1
    drafts = ids[:, 1:]
    # Each request's parameters on its K + 1 rows (expand, not repeat_interleave: no size to compute).
    per_row = RowParams(*(getattr(rows, f)[:, None].expand(b, r).reshape(-1) for f in RowParams.FIELDS))
    probs = kept_distribution(logits.reshape(b * r, v), per_row, width).view(b, r, v)
    p_draft = probs[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.rand(b, k, device=logits.device, generator=generator)
    lengths = _leading(u < p_draft, limits)  # greedy rows: p is one-hot, so exactly the argmax test
    # Exponential races draw from unnormalised distributions: argmax(p / E), E ~ Exp(1). One noise
    # tensor serves the full p and the residual (p without the draft): a row emits one of the two.
    race = torch.empty_like(probs).exponential_(generator=generator).clamp_min_(torch.finfo(torch.float32).tiny)
    race = torch.div(probs, race, out=race)
    del probs
    from_full = race.argmax(-1)
    race[:, :k].scatter_(-1, drafts[..., None], 0.0)
    from_residual = race.argmax(-1)
    # Stopped early at a rejected draft: the residual; ran out of drafts it may accept: the full p.
    stopped = (lengths < limits)[:, None]
    return _emit(ids, lengths, torch.where(stopped, from_residual, from_full))


def sample_accept(
    logits: torch.Tensor,  # [B, K + 1, V] float, grammar masks applied
    ids: torch.Tensor,
    params: list,  # SamplingParams per request
    limits: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Accepted:
    """The sampled rule outside a graph, from the requests' SamplingParams."""
    v = logits.shape[-1]
    info = SamplingBatchInfo.from_params(params, v, logits.device)
    return sampled_accept(logits, ids, RowParams.of(info), limits, filter_width(params, v), generator)
