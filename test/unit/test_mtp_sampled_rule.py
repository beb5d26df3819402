"""MTP's sampled acceptance from per-request tensors (the verify graph's rule): the distribution it
judges with is the plain sampler's, the static-buffer step decides exactly as the SamplingParams
path (sample_accept) for the same draws, greedy rows stay greedy, and the emitted tokens follow the
exact sequence distribution (chi-square). A stand-in runner returns chosen logits, so these run
the rule through VerifyGraphRunner's buffers without a model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.models.inkling.model import ModelOutput
from sgl_inkling.sampling.sampler import TOPK_CANDIDATES, sampling_distribution
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo
from sgl_inkling.sampling.sampling_params import SamplingParams
from sgl_inkling.speculative.acceptance import (
    RowParams,
    filter_width,
    greedy_accept,
    kept_distribution,
    sample_accept,
)
from sgl_inkling.speculative.verify_graphs import (
    LOGITS_MEMORY_SHARE,
    SAMPLED_BYTES_PER_LOGIT,
    VerifyGraphRunner,
    sampled_graph_max_bs,
)

PAD_ROW = 99
MIXED = [  # greedy, temperature only, top-k, top-p alone (a full sort), top-k + top-p, min-p, wide top-k
    {"temperature": 0}, {"temperature": 0.7}, {"temperature": 1.0, "top_k": 3}, {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 1.3, "top_k": 40, "top_p": 0.8}, {"temperature": 0.5, "min_p": 0.1},
    {"temperature": 0.9, "top_k": TOPK_CANDIDATES + 500}, {"temperature": 0, "top_k": 2},
]  # fmt: skip


def params_of(dicts) -> list[SamplingParams]:
    return [SamplingParams.from_dict(d) for d in dicts]


def test_kept_distribution_is_the_plain_samplers():
    """The host-flag-free distribution equals sampler.sampling_distribution (which dispatches per
    row on the host) for every mix: all filters on the full sort, narrow ones on the topk
    candidates, and temperature alone with no filter pass."""
    g = torch.Generator().manual_seed(1)
    vocab = 3000  # past TOPK_CANDIDATES: the candidate path and the full sort differ
    for dicts in (MIXED, [d for d in MIXED if d.get("top_p", 1) == 1 and d.get("top_k", 0) <= 40],
                  [{"temperature": 0.8}, {"temperature": 0}]):  # fmt: skip
        params = params_of(dicts)
        logits = torch.randn(len(params), vocab, generator=g) * 3
        logits[:, 7] = logits[:, 11] = logits.max() + 1  # tied top tokens: greedy rows take the lower id
        info = SamplingBatchInfo.from_params(params, vocab)
        width = filter_width(params, vocab)
        want = sampling_distribution(logits, info)
        got = kept_distribution(logits, RowParams.of(info), width)
        assert torch.equal(got > 0, want > 0), width  # the same kept sets
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-4)
    assert [filter_width(params_of(d), vocab) for d in ([MIXED[1]], [MIXED[2]], [MIXED[3]], [MIXED[6]])] == [
        0, TOPK_CANDIDATES, vocab, vocab]  # fmt: skip


class FakeRunner:
    """What VerifyGraphRunner needs of a ModelRunner; forward_eager returns `self.logits` for the
    bucket's rows and records the static token ids it was given."""

    def __init__(self, vocab: int):
        self.device = torch.device("cpu")
        self.req_to_token = SimpleNamespace(pad_row=PAD_ROW)
        self.model = SimpleNamespace(cfg=SimpleNamespace(unpadded_vocab_size=vocab, vocab_size=vocab))
        self.logits = None
        self.seen_ids = None

    def forward_eager(self, batch: ForwardBatch) -> ModelOutput:
        self.seen_ids = batch.input_ids.clone()
        n = batch.input_ids.numel()
        return ModelOutput(logits=self.logits[:n], hidden=torch.zeros(n, 4))


def verify_batch(ids: torch.Tensor) -> ForwardBatch:
    b, r = ids.shape
    return ForwardBatch.build(ForwardMode.EXTEND, ids, list(range(b)), [5] * b, list(range(1, b * r + 1)),
                              list(range(1, b * r + 1)), "cpu", logits_counts=[r] * b)  # fmt: skip


def drafted(logits: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """[B, r] ids: a pending token, then drafts that are the row's argmax about half the time."""
    b, r, v = logits.shape
    ids = torch.randint(0, v, (b, r), generator=g)
    agree = torch.rand(b, r - 1, generator=g) < 0.6
    ids[:, 1:] = torch.where(agree, logits[:, :-1].argmax(-1), ids[:, 1:])
    return ids


@pytest.mark.parametrize("vocab", [3000, 64])
def test_static_buffer_sampled_step_equals_sample_accept(vocab):
    """Five requests (bucket 8: three padded) with K = 3, mixing greedy, temperature, top-k, top-p
    and min-p rows: the runner's sampled rule on its static buffers and sample_accept on the
    SamplingParams give the same lengths and tokens from the same generator state (the reference
    sees the padded batch too: the draws are laid out by the bucket's shape); greedy rows equal
    greedy_accept. vocab 64: every filter width is the whole vocabulary."""
    g = torch.Generator().manual_seed(2)
    b, r, bucket = 5, 4, 8
    dicts = [MIXED[i] for i in (0, 2, 4, 5, 1)] if vocab > 64 else [MIXED[i] for i in (0, 3, 4, 5, 7)]
    params = params_of(dicts)
    runner = FakeRunner(vocab)
    vg = VerifyGraphRunner(runner, r, {}, 16, graphs=False, sampled_max_bs=8)
    for step in range(3):  # a full bucket, then padded ones reusing the buffers
        n = bucket if step == 0 else b
        logits = torch.randn(bucket, r, vocab, generator=g) * 2.5
        ids = drafted(logits, g)
        limits = torch.tensor([3, 3, 2, 3, 1, 3, 3, 3][:n])
        rows_params = params if n == b else params + params_of([MIXED[1], MIXED[2], MIXED[5]])
        runner.logits = logits.view(bucket * r, vocab)
        sampled = vg.sampling_inputs(rows_params, excluded=False)
        assert sampled is not None
        torch.manual_seed(100 + step)
        out, acc = vg.replay(verify_batch(ids[:n]), limits, torch.full((n,), -1), *sampled)
        assert torch.equal(runner.seen_ids[: n * r], ids[:n].flatten())
        assert torch.equal(out.logits, logits[:n].reshape(n * r, vocab))
        pad_params = rows_params + params_of([{"temperature": 0}] * (bucket - n))
        pad_limits = torch.cat([limits, torch.zeros(bucket - n, dtype=torch.int64)])
        torch.manual_seed(100 + step)
        want = sample_accept(logits, ids, pad_params, pad_limits)
        assert torch.equal(acc.lengths, want.lengths[:n]) and torch.equal(acc.tokens, want.tokens[:n])
        greedy = greedy_accept(logits[:1], ids[:1], limits[:1])
        assert acc.to_host()[0] == greedy.to_host()[0]
    assert 0 < int(acc.lengths.sum()) < int(limits.sum())  # some drafts accepted, some rejected


def exact_sequences(p: torch.Tensor, drafts: list[int], limit: int) -> dict[tuple[int, ...], float]:
    """The emitted sequences' exact probabilities: tokens drawn one by one from the position's
    distribution p[j], continuing while the draw equals draft j + 1 (up to `limit` drafts)."""
    out: dict[tuple[int, ...], float] = {}

    def walk(j: int, prefix: tuple[int, ...], mass: float) -> None:
        for t in p[j].nonzero().flatten().tolist():
            m = mass * float(p[j, t])
            if j < limit and t == drafts[j]:
                walk(j + 1, prefix + (t,), m)
            else:
                out[prefix + (t,)] = out.get(prefix + (t,), 0.0) + m

    walk(0, (), 1.0)
    return out


def test_static_buffer_sampled_step_keeps_the_distribution():
    """Many replays of one verify (K = 2) through the runner's static buffers: the emitted sequences
    of two parameter groups against the exact sequential-sampling distribution (brute force over
    the plain sampler's per-position distributions), chi-square. Group b's limit 1 stops after one
    draft and then draws from the full distribution."""
    vocab, r, bs = 8, 3, 32
    g = torch.Generator().manual_seed(3)
    base = torch.randn(r, vocab, generator=g) * 1.5
    drafts = [int(base[0].argsort()[-2]), int(base[1].argmax())]  # draft 1: a likely non-argmax
    groups = {"a": ({"temperature": 0.8, "top_k": 5}, 2), "b": ({"temperature": 1.2, "top_p": 0.8, "min_p": 0.05}, 1)}
    runner = FakeRunner(vocab)
    vg = VerifyGraphRunner(runner, r, {}, bs, graphs=False, sampled_max_bs=bs)
    runner.logits = base.repeat(bs, 1)
    ids = torch.tensor([[1] + drafts] * bs)
    params = params_of([groups["a"][0]] * (bs // 2) + [groups["b"][0]] * (bs // 2))
    limits = torch.tensor([groups["a"][1]] * (bs // 2) + [groups["b"][1]] * (bs // 2))
    counts = {"a": {}, "b": {}}
    torch.manual_seed(4)
    sampled = vg.sampling_inputs(params, excluded=False)
    for _ in range(120):
        _, acc = vg.replay(verify_batch(ids), limits, torch.full((bs,), -1), *sampled)
        for i, seq in enumerate(acc.to_host()):
            c = counts["a" if i < bs // 2 else "b"]
            c[tuple(seq)] = c.get(tuple(seq), 0) + 1
    for name, (d, limit) in groups.items():
        info = SamplingBatchInfo.from_params(params_of([d] * r), vocab)
        exact = exact_sequences(sampling_distribution(base, info), drafts, limit)
        n = sum(counts[name].values())
        assert set(counts[name]) <= set(exact), name  # nothing the filters forbid
        keys = sorted(exact, key=exact.get, reverse=True)
        common = [k for k in keys if exact[k] * n >= 5]
        obs = [counts[name].get(k, 0) for k in common] + [n - sum(counts[name].get(k, 0) for k in common)]
        exp = [exact[k] * n for k in common] + [n * (1 - sum(exact[k] for k in common))]
        if exp[-1] < 5:  # pool the rest into the rarest common sequence
            rest_obs, rest_exp = obs.pop(), exp.pop()
            obs[-1] += rest_obs
            exp[-1] += rest_exp
        assert len(common) >= 4 and any(len(k) == limit + 1 for k in common), (name, common)
        assert chisquare(obs, exp).pvalue > 1e-3, (name, list(zip(obs, exp)))


def test_sampled_graphs_cover_the_buckets_whose_temporaries_fit():
    """sampled_graph_max_bs: a pure function of the free bytes beside what the greedy graphs keep,
    at most the greedy graphs' batch."""
    from sgl_inkling.speculative.verify_graphs import kept_logits_bytes

    runner = SimpleNamespace(model=SimpleNamespace(cfg=SimpleNamespace(vocab_size=1000)), dtype=torch.bfloat16)
    widths = range(9, 0, -1)
    per_req = 9 * 1000 * SAMPLED_BYTES_PER_LOGIT
    assert SAMPLED_BYTES_PER_LOGIT == 12  # float32 logits + probabilities + noise
    kept = kept_logits_bytes(runner, widths, 64)
    room = lambda bs: int((kept + bs * per_req) / LOGITS_MEMORY_SHARE) + 1  # noqa: E731
    assert sampled_graph_max_bs(runner, widths, 64, room(40)) == 40
    assert sampled_graph_max_bs(runner, widths, 64, room(500)) == 64
    assert sampled_graph_max_bs(runner, widths, 64, room(0)) == 0
    assert sampled_graph_max_bs(runner, widths, 64, 0) == 0  # the greedy graphs took it all
    vg = VerifyGraphRunner(FakeRunner(3000), 9, {}, 64, graphs=False, sampled_max_bs=40)
    assert vg.sampled_buckets[-1] <= 40 and vg.buckets[-1] == 64
    plain = params_of([{"temperature": 0.7}] * vg.sampled_buckets[-1])
    assert vg.sampling_inputs(plain, excluded=False) is not None
    assert vg.sampling_inputs(plain + plain[:1], excluded=False) is None  # past the sampled buckets
    assert vg.sampling_inputs(plain[:2], excluded=True) is None  # grammar or forced counts
    assert vg.sampling_inputs(params_of([{"temperature": 0}] * 2), excluded=False) is None  # greedy graph
    for extra in ({"temperature": 0.7, "frequency_penalty": 0.5}, {"temperature": 0.7, "seed": 3},
                  {"temperature": 0.7, "top_p": 0.9}):  # penalties, seeds, a top-p past the candidates
        assert vg.sampling_inputs(plain[:2] + params_of([extra]), excluded=False) is None, extra
