"""Batched next-token sampling: greedy, temperature, top-k, top-p, min-p, seeds, logprobs.

Pipeline for a batch of logits [B, V] (float32), following SGLang:

1. penalties and logit_bias (PenaltyState) and the grammar vocab mask, in place;
2. temperature: logits /= T (greedy rows carry T = 1);
3. greedy rows: argmax (ties go to the lowest id, as torch.argmax);
4. sampled rows: probs = softmax, then the filters, all judged on that one distribution
   (SGLang's "joint" order, i.e. top-p is not recomputed after top-k):
   top-k keeps the k most probable tokens, top-p keeps the smallest most-probable prefix whose
   mass reaches top_p, min-p drops tokens with p < min_p * max p; the top token is always
   kept, and so is any token tied in probability with the last kept one;
5. draw from the renormalised kept set with the exponential race argmax_i(p_i / E_i),
   E_i ~ Exp(1) iid, which picks token i with probability p_i / sum(p) and needs no sort and
   no cumulative sum over the vocabulary.

Seeds: the noise of a seeded row comes from a generator seeded by hash(seed, step), where step
is the request's own decode step, and is laid out in vocabulary order. The kept set and the
probabilities depend only on that row, so a seeded row yields the same token whatever else is
in the batch. Unseeded rows share one generator owned by the Sampler.

Logprobs (SGLang's default): log_softmax of the logits after penalties, grammar mask and
temperature, before the top-k/top-p/min-p filters; for greedy rows that is log_softmax of the
penalised logits. With return_original_logprob=True (SGLang's SGLANG_RETURN_ORIGINAL_LOGPROB)
they are log_softmax of the logits exactly as the model produced them. Values are clamped to
the float32 minimum so that -inf never reaches JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from .host_copy import HostCopy, to_device
from .sampling_batch_info import SamplingBatchInfo

_MASK64 = (1 << 64) - 1
# Rows whose top-k is at most this find their thresholds with topk() instead of a full sort.
TOPK_CANDIDATES = 1024


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def seed_for_step(seed: int, step: int) -> int:
    """Counter-based generator seed for one request step (independent streams per step)."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ (step & _MASK64))


@dataclass
class SampleOutput:
    """Device tensors; call to_host() once to read everything back."""

    next_token_ids: torch.Tensor  # [B] int64
    next_token_logprobs: torch.Tensor | None = None  # [B] float32
    # Single topk with the largest requested n; row i uses its first top_logprobs_nums[i] columns.
    top_logprobs_vals: torch.Tensor | None = None  # [B, max_n]
    top_logprobs_ids: torch.Tensor | None = None  # [B, max_n]
    top_logprobs_nums: list[int] | None = None
    # Logprobs of caller-chosen token ids, flattened over rows in order.
    token_ids_logprobs_flat: torch.Tensor | None = None
    token_ids_logprobs: list[list[int] | None] | None = None

    def to_host_later(self) -> Callable[[], HostSampleOutput]:
        """Start the copies to the host now; the returned call waits for them (overlap scheduling
        reads step n's tokens after launching step n + 1)."""
        copy = HostCopy([getattr(self, f) for f in _DEVICE_FIELDS])
        return lambda: replace(self, **dict(zip(_DEVICE_FIELDS, copy.wait()))).to_host()

    def to_host(self) -> HostSampleOutput:
        out = HostSampleOutput(next_token_ids=self.next_token_ids.tolist())
        if self.next_token_logprobs is not None:
            out.next_token_logprobs = self.next_token_logprobs.tolist()
        if self.top_logprobs_nums is not None:
            if self.top_logprobs_vals is None or self.top_logprobs_ids is None:
                out.top_logprobs_vals = [[] for _ in self.top_logprobs_nums]
                out.top_logprobs_ids = [[] for _ in self.top_logprobs_nums]
            else:
                vals, ids = self.top_logprobs_vals.tolist(), self.top_logprobs_ids.tolist()
                out.top_logprobs_vals = [v[:k] for v, k in zip(vals, self.top_logprobs_nums)]
                out.top_logprobs_ids = [t[:k] for t, k in zip(ids, self.top_logprobs_nums)]
        if self.token_ids_logprobs is not None:
            flat = self.token_ids_logprobs_flat.tolist() if self.token_ids_logprobs_flat is not None else []
            out.token_ids_logprobs_vals, out.token_ids_logprobs_ids = [], []
            pos = 0
            for ids in self.token_ids_logprobs:
                ids = list(ids or [])
                out.token_ids_logprobs_vals.append(flat[pos : pos + len(ids)])
                out.token_ids_logprobs_ids.append(ids)
                pos += len(ids)
        return out


_DEVICE_FIELDS = ("next_token_ids", "next_token_logprobs", "top_logprobs_vals", "top_logprobs_ids",
                  "token_ids_logprobs_flat")  # fmt: skip


@dataclass
class HostSampleOutput:
    next_token_ids: list[int]
    next_token_logprobs: list[float] | None = None
    top_logprobs_vals: list[list[float]] | None = None
    top_logprobs_ids: list[list[int]] | None = None
    token_ids_logprobs_vals: list[list[float]] | None = None
    token_ids_logprobs_ids: list[list[int]] | None = None


class Sampler:
    def __init__(self, seed: int | None = None, *, return_original_logprob: bool = False) -> None:
        """seed: seeds the shared generator used by rows without their own seed."""
        self.seed = seed
        self.return_original_logprob = return_original_logprob
        self._global: dict[str, torch.Generator] = {}
        self._per_row: dict[str, torch.Generator] = {}

    # ------------------------------------------------------------------ generators

    def _global_generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        g = self._global.get(key)
        if g is None:
            g = torch.Generator(device=device)
            if self.seed is None:
                g.seed()
            else:
                g.manual_seed(self.seed)
            self._global[key] = g
        return g

    def _row_generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._per_row:
            self._per_row[key] = torch.Generator(device=device)
        return self._per_row[key]

    def _exponential_noise(
        self,
        shape: tuple[int, ...],
        device: torch.device,
        info: SamplingBatchInfo,
        steps: Sequence[int] | None,
    ) -> torch.Tensor:
        noise = torch.empty(shape, dtype=torch.float32, device=device)
        seeded = [
            i for i, (s, p) in enumerate(zip(info.seeds, info.params)) if s is not None and not p.is_greedy
        ]
        if len(seeded) < shape[0]:
            noise.exponential_(generator=self._global_generator(device))
        if seeded:
            if steps is None or len(steps) != shape[0]:
                raise ValueError(
                    "seeded requests need `steps` (each request's decode step index), one per row"
                )
            g = self._row_generator(device)
            for i in seeded:
                seed = info.seeds[i]
                assert seed is not None
                g.manual_seed(seed_for_step(seed, int(steps[i])))
                noise[i].exponential_(generator=g)
        # Exp(1) draws of exactly 0 would turn p / E into inf or NaN.
        return noise.clamp_min_(torch.finfo(torch.float32).tiny)

    # ------------------------------------------------------------------ main entry

    def sample(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        *,
        steps: Sequence[int] | None = None,
        return_logprob: bool = False,
        top_logprobs_nums: Sequence[int] | None = None,
        token_ids_logprobs: Sequence[Sequence[int] | None] | None = None,
    ) -> SampleOutput:
        """Sample one token per row. `logits` [B, V] float32 is modified in place.

        steps[i]: request i's decode step (number of tokens it has generated so far); required
        when a sampled row has a seed. top_logprobs_nums / token_ids_logprobs are per row and
        imply return_logprob.
        """
        if logits.dim() != 2 or logits.shape[0] != len(info):
            raise ValueError(f"logits must be [{len(info)}, V], got {tuple(logits.shape)}")
        if logits.shape[1] != info.vocab_size:
            raise ValueError(f"logits vocab {logits.shape[1]} != batch vocab {info.vocab_size}")
        want_top = top_logprobs_nums is not None and any(n > 0 for n in top_logprobs_nums)
        return_logprob = return_logprob or want_top or token_ids_logprobs is not None

        raw = None
        if return_logprob and self.return_original_logprob:
            modifies = (
                info.penalties is not None and info.penalties.is_active
            ) or info.vocab_mask is not None
            raw = logits.clone() if modifies or not info.is_all_greedy else logits

        if info.penalties is not None:
            info.penalties.apply(logits)
        if info.vocab_mask is not None:
            logits.masked_fill_(~info.vocab_mask, float("-inf"))

        if info.is_all_greedy:
            next_ids = torch.argmax(logits, dim=-1)
        else:
            # Greedy rows have temperature 1, so their argmax is unaffected by the division.
            logits.div_(info.temperatures.unsqueeze(1))
            probs = _filtered_probs(torch.softmax(logits, dim=-1), info)
            noise = self._exponential_noise(tuple(logits.shape), logits.device, info, steps)
            next_ids = probs.div_(noise).argmax(dim=-1)
            del probs, noise
            if info.any_greedy:
                next_ids = torch.where(info.is_greedy, torch.argmax(logits, dim=-1), next_ids)

        out = SampleOutput(next_token_ids=next_ids)
        if return_logprob:
            src = raw if raw is not None else logits
            _fill_logprobs(out, src, next_ids, top_logprobs_nums, token_ids_logprobs)
        return out


def _fill_logprobs(
    out: SampleOutput,
    src: torch.Tensor,
    next_ids: torch.Tensor,
    top_logprobs_nums: Sequence[int] | None,
    token_ids_logprobs: Sequence[Sequence[int] | None] | None,
) -> None:
    # logprob = x - logsumexp(x); never materialise the full [B, V] log_softmax.
    floor = torch.finfo(torch.float32).min
    lse = torch.logsumexp(src, dim=-1)
    chosen = src.gather(1, next_ids.unsqueeze(1)).squeeze(1)
    out.next_token_logprobs = (chosen - lse).clamp_min(floor)
    if top_logprobs_nums is not None:
        nums = [int(n) for n in top_logprobs_nums]
        if len(nums) != src.shape[0]:
            raise ValueError("top_logprobs_nums must have one entry per row")
        out.top_logprobs_nums = nums
        k = min(max(nums, default=0), src.shape[1])
        if k > 0:
            vals, ids = src.topk(k, dim=-1)
            out.top_logprobs_vals = (vals - lse.unsqueeze(1)).clamp_min(floor)
            out.top_logprobs_ids = ids
    if token_ids_logprobs is not None:
        if len(token_ids_logprobs) != src.shape[0]:
            raise ValueError("token_ids_logprobs must have one entry per row")
        rows = [i for i, ids in enumerate(token_ids_logprobs) for _ in (ids or ())]
        toks = [int(t) for ids in token_ids_logprobs for t in (ids or ())]
        out.token_ids_logprobs = [None if ids is None else list(ids) for ids in token_ids_logprobs]
        if rows:
            r = to_device(rows, torch.int64, src.device)
            t = to_device(toks, torch.int64, src.device)
            out.token_ids_logprobs_flat = (src[r, t] - lse[r]).clamp_min(floor)


def _filtered_probs(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Zero (in place) the tokens that top-k / top-p / min-p exclude; not renormalised.

    Each filter reduces to a per-row probability threshold and a token is kept iff p >= the
    largest of them, so the mask is built in vocabulary order and tokens tied with a boundary
    token are all kept: top-k: the k-th largest p; top-p: the p of the first token (in
    descending order) at which the cumulative mass reaches top_p; min-p: min_p * max p.
    """
    threshold = None
    if info.need_min_p:
        threshold = info.min_ps * probs.amax(dim=-1)
    if info.need_top_k or info.need_top_p:
        t = _top_k_top_p_thresholds(probs, info)
        threshold = t if threshold is None else torch.maximum(threshold, t)
    if threshold is not None:
        probs.masked_fill_(probs < threshold.unsqueeze(1), 0.0)
    return probs


def _top_k_top_p_thresholds(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    batch, vocab = probs.shape
    width = min(TOPK_CANDIDATES, vocab)
    # A row needs the full sort only if its top-p boundary may lie beyond the candidates and
    # no top-k at or below `width` would cut there anyway. The choice depends on the row's
    # own parameters alone, which keeps seeded rows independent of the batch.
    narrow: list[int] = []
    wide: list[int] = []
    for i, p in enumerate(info.params):
        k = vocab if p.top_k < 0 else min(p.top_k, vocab)
        if p.is_greedy or (k >= vocab and p.top_p >= 1.0):
            continue
        (narrow if k <= width else wide).append(i)
    out = torch.zeros(batch, dtype=probs.dtype, device=probs.device)
    for rows, w in ((narrow, width), (wide, vocab)):
        if not rows:
            continue
        if len(rows) == batch:
            sub, top_ks, top_ps = probs, info.top_ks, info.top_ps
        else:
            idx = to_device(rows, torch.int64, probs.device)
            sub, top_ks, top_ps = probs.index_select(0, idx), info.top_ks[idx], info.top_ps[idx]
        vals = sub.sort(dim=-1, descending=True).values if w == vocab else sub.topk(w, dim=-1).values
        t = prefix_threshold(vals, top_ks, top_ps, vocab)
        out = t if len(rows) == batch else out.index_copy_(0, idx, t)
    return out


def prefix_threshold(
    vals: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, vocab: int
) -> torch.Tensor:
    """Thresholds from the w largest probabilities of each row (descending), w <= vocab."""
    w = vals.shape[1]
    zero = torch.zeros((), dtype=vals.dtype, device=vals.device)
    k = top_ks.clamp(1, vocab)
    # k > w only for rows without top-k (k == vocab) on the candidate path.
    t_k = torch.where(k <= w, vals.gather(1, (k - 1).clamp_max(w - 1).unsqueeze(1)).squeeze(1), zero)
    # Tokens before the boundary have inclusive cumulative mass < top_p.
    boundary = (vals.cumsum(dim=-1) < top_ps.unsqueeze(1)).sum(dim=-1)
    t_p = vals.gather(1, boundary.clamp_max(w - 1).unsqueeze(1)).squeeze(1)
    # top_p >= 1 keeps everything despite rounding; a boundary past the candidates is
    # dominated by that row's top-k threshold, which is then at or above vals[w - 1].
    t_p = torch.where((top_ps < 1.0) & (boundary < w), t_p, zero)
    return torch.maximum(t_k, t_p)


def sampling_distribution(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """The distribution `Sampler.sample` draws from, renormalised, [B, V] (input untouched).

    Expects logits that already carry penalties / masks. Greedy rows are one-hot at argmax.
    """
    x = logits / info.temperatures.unsqueeze(1)
    probs = _filtered_probs(torch.softmax(x, dim=-1), info)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    if info.any_greedy:
        one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(info.is_greedy.unsqueeze(1), one_hot, probs)
    return probs
