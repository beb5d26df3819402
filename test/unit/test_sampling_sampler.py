"""Sampler against independent float64 / brute-force references."""

import math
import random

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from sgl_inkling.sampling import sampler as sampler_module
from sgl_inkling.sampling.sampler import Sampler, sampling_distribution
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo
from sgl_inkling.sampling.sampling_params import SamplingParams

# ---------------------------------------------------------------------------- references


def ref_softmax(row, temperature=1.0):
    x = np.asarray(row, dtype=np.float64) / temperature
    e = np.exp(x - x.max())
    return e / e.sum()


def ref_kept(row, p: SamplingParams):
    """Tokens top-k/top-p/min-p keep, judged on softmax(row / T); plus the smallest decision margin."""
    probs = ref_softmax(row, p.temperature)
    order = sorted(range(len(probs)), key=lambda t: (-probs[t], t))
    kept, mass, margin = set(), 0.0, math.inf
    pmax = probs[order[0]]
    for rank, tok in enumerate(order):
        ok = True
        if p.top_k > 0:
            ok &= rank < p.top_k
        if p.top_p < 1.0:
            ok &= mass < p.top_p
            margin = min(margin, abs(mass - p.top_p))
        if p.min_p > 0.0:
            ok &= probs[tok] >= p.min_p * pmax
            margin = min(margin, abs(probs[tok] - p.min_p * pmax) / pmax)
        if ok or rank == 0:
            kept.add(tok)
        mass += probs[tok]
    return kept, probs, margin


def ref_distribution(row, p: SamplingParams):
    if p.is_greedy:
        out = np.zeros(len(row))
        out[int(np.argmax(row))] = 1.0
        return out
    kept, probs, _ = ref_kept(row, p)
    out = np.array([probs[t] if t in kept else 0.0 for t in range(len(row))])
    return out / out.sum()


def ref_log_softmax(row):
    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def well_separated_logits(rng: np.random.Generator, v: int, params: list[SamplingParams], scale=2.0):
    """Draw logits far from any filter boundary, so float32 and float64 agree on the kept set."""
    rows = []
    for p in params:
        while True:
            row = rng.normal(size=v) * scale
            if p.is_greedy or ref_kept(row, p)[2] > 1e-3:
                rows.append(row)
                break
    return torch.tensor(np.array(rows), dtype=torch.float32)


FILTER_PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(top_p=0.5),
    SamplingParams(temperature=1.3, top_p=0.8, top_k=5),
    SamplingParams(min_p=0.2),
    SamplingParams(temperature=0.5, min_p=0.05, top_p=0.9),
    SamplingParams(top_k=4, top_p=0.95, min_p=0.1),
    SamplingParams(temperature=0.0),
    SamplingParams(top_k=1, temperature=0.8),
    SamplingParams(top_p=0.01),  # keeps only the top token
]


@pytest.fixture(params=[1024, 3], ids=["topk-path", "sort-path"])
def candidates(request, monkeypatch):
    """Run a test with the default top-k candidate width and with one so small that most
    filtered rows take the full-sort path (mixed with candidate rows in the same batch)."""
    monkeypatch.setattr(sampler_module, "TOPK_CANDIDATES", request.param)
    return request.param


# ---------------------------------------------------------------------------- greedy


def test_greedy_is_argmax_with_lowest_index_ties():
    logits = torch.tensor(
        [[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -0.5, -0.5], [1.0, 2.0, 3.0, 4.0]]
    )
    info = SamplingBatchInfo.from_params([SamplingParams(temperature=0.0)] * 4, 4)
    assert info.is_all_greedy
    ids = Sampler(seed=0).sample(logits.clone(), info).next_token_ids.tolist()
    assert ids == [1, 0, 2, 3]


def test_greedy_rows_in_mixed_batch():
    rng = np.random.default_rng(0)
    v = 50
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=5)] * 8
    logits = torch.tensor(rng.normal(size=(len(params), v)), dtype=torch.float32)
    info = SamplingBatchInfo.from_params(params, v)
    assert info.any_greedy and not info.is_all_greedy
    for trial in range(5):
        ids = Sampler(seed=trial).sample(logits.clone(), info).next_token_ids.tolist()
        for i, p in enumerate(params):
            row = logits[i].numpy()
            if p.is_greedy:
                assert ids[i] == int(np.argmax(row))
            else:
                assert ids[i] in ref_kept(row, p)[0]


# ---------------------------------------------------------------------------- filters


def test_filtered_distribution_matches_reference(candidates):
    rng = np.random.default_rng(1)
    v = 40
    params = FILTER_PARAMS * 3
    logits = well_separated_logits(rng, v, params)
    info = SamplingBatchInfo.from_params(params, v)
    got = sampling_distribution(logits, info)
    for i, p in enumerate(params):
        expected = ref_distribution(logits[i].numpy(), p)
        np.testing.assert_allclose(got[i].numpy(), expected, rtol=1e-4, atol=1e-6)
        assert set(np.nonzero(got[i].numpy())[0].tolist()) == set(np.nonzero(expected)[0].tolist())


def test_sampled_support_equals_brute_force_kept_set(candidates):
    rng = np.random.default_rng(2)
    v = 12
    configs = [p for p in FILTER_PARAMS if not p.is_greedy]
    copies = 2000
    logits_cfg = well_separated_logits(rng, v, configs, scale=0.7)
    # Every kept token must be likely enough to show up in `copies` draws.
    for i, p in enumerate(configs):
        dist = ref_distribution(logits_cfg[i].numpy(), p)
        assert dist[dist > 0].min() > 0.01
    params = [p for p in configs for _ in range(copies)]
    logits = logits_cfg.repeat_interleave(copies, dim=0)
    info = SamplingBatchInfo.from_params(params, v)
    ids = Sampler(seed=7).sample(logits.clone(), info).next_token_ids.view(len(configs), copies)
    for i, p in enumerate(configs):
        kept = ref_kept(logits_cfg[i].numpy(), p)[0]
        assert set(ids[i].tolist()) == kept, p


def _empirical(params: SamplingParams, row: torch.Tensor, n: int, seed: int) -> np.ndarray:
    info = SamplingBatchInfo.from_params([params] * n, row.numel())
    ids = Sampler(seed=seed).sample(row.expand(n, -1).clone(), info).next_token_ids
    return np.bincount(ids.numpy(), minlength=row.numel())


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=2.0),
        SamplingParams(top_k=4),
        SamplingParams(top_p=0.7),
        SamplingParams(min_p=0.15, temperature=1.5),
    ],
    ids=["t1", "t0.5", "t2", "topk4", "topp0.7", "minp"],
)
def test_empirical_frequencies_chi_square(params, candidates):
    row = torch.tensor([1.0, 0.2, -0.3, 2.0, 0.5, -1.0, 0.0], dtype=torch.float32)
    n = 40000
    counts = _empirical(params, row, n, seed=11)
    expected = ref_distribution(row.numpy(), params)
    support = expected > 0
    assert counts[~support].sum() == 0
    assert chisquare(counts[support], expected[support] * n).pvalue > 1e-3


def test_temperature_changes_distribution_as_expected():
    row = torch.tensor([1.0, 0.2, -0.3, 2.0, 0.5, -1.0, 0.0], dtype=torch.float32)
    n = 40000
    base = ref_softmax(row.numpy())
    cold = _empirical(SamplingParams(temperature=0.5), row, n, seed=3)
    hot = _empirical(SamplingParams(temperature=2.0), row, n, seed=4)
    # The test has power: T=0.5 / T=2 samples are clearly not softmax(logits).
    assert chisquare(cold, base * n).pvalue < 1e-6
    assert chisquare(hot, base * n).pvalue < 1e-6
    # Lower temperature concentrates mass on the argmax; higher spreads it out.
    top = int(np.argmax(base))
    assert cold[top] / n > base[top] + 0.1 > hot[top] / n + 0.1


# ---------------------------------------------------------------------------- seeds


def _sample_one(sampler, params, logits, step, others=(), position=0):
    """Sample the target row placed at `position` among other rows."""
    rows = list(others)
    rows.insert(position, (params, logits, step))
    info = SamplingBatchInfo.from_params([r[0] for r in rows], logits.numel())
    x = torch.stack([r[1] for r in rows])
    out = sampler.sample(x, info, steps=[r[2] for r in rows])
    return out.next_token_ids[position].item()


def test_seed_reproducible_regardless_of_batch(candidates):
    g = torch.Generator().manual_seed(0)
    v = 64
    logits = torch.randn(v, generator=g)
    other_rows = [
        (SamplingParams(top_k=5, top_p=0.6), torch.randn(v, generator=g), 3),
        (SamplingParams(temperature=0.0), torch.randn(v, generator=g), 0),
        (SamplingParams(seed=99, min_p=0.1), torch.randn(v, generator=g), 17),
        (SamplingParams(), torch.randn(v, generator=g), 8),
    ]
    for params in [SamplingParams(seed=1234), SamplingParams(seed=5, temperature=0.8, top_p=0.9)]:
        for step in range(4):
            alone = _sample_one(Sampler(seed=1), params, logits, step)
            for pos, k in [(0, 1), (1, 2), (4, 4), (2, 3)]:
                got = _sample_one(Sampler(seed=100 + pos), params, logits, step, other_rows[:k], position=pos)
                assert got == alone


def test_seed_varies_with_step_and_seed():
    v = 32
    logits = torch.zeros(v)  # uniform
    by_step = {_sample_one(Sampler(), SamplingParams(seed=7), logits, s) for s in range(20)}
    by_seed = {_sample_one(Sampler(), SamplingParams(seed=s), logits, 0) for s in range(20)}
    assert len(by_step) > 5 and len(by_seed) > 5


def test_seeded_rows_follow_the_distribution():
    row = torch.tensor([0.5, 1.5, -0.5, 0.0, 1.0], dtype=torch.float32)
    n = 20000
    params = [SamplingParams(seed=s) for s in range(n)]
    info = SamplingBatchInfo.from_params(params, row.numel())
    ids = Sampler().sample(row.expand(n, -1).clone(), info, steps=[3] * n).next_token_ids
    counts = np.bincount(ids.numpy(), minlength=row.numel())
    assert chisquare(counts, ref_softmax(row.numpy()) * n).pvalue > 1e-3


def test_seeded_rows_require_steps():
    info = SamplingBatchInfo.from_params([SamplingParams(seed=1)], 4)
    with pytest.raises(ValueError, match="steps"):
        Sampler().sample(torch.zeros(1, 4), info)


def test_unseeded_reproducible_with_sampler_seed():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 100, generator=g)
    info = SamplingBatchInfo.from_params([SamplingParams(top_p=0.9)] * 16, 100)
    a = Sampler(seed=42).sample(logits.clone(), info).next_token_ids
    b = Sampler(seed=42).sample(logits.clone(), info).next_token_ids
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------- logprobs


def test_logprobs_processed_and_original():
    rng = np.random.default_rng(5)
    v = 30
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.5),
        SamplingParams(temperature=0.5, top_k=3),
        SamplingParams(temperature=2.0, frequency_penalty=1.0),
        SamplingParams(),
    ]
    prompts = [[0, 1, 2], [], [], [4]]
    outputs = [[3], [], [5, 5], []]
    logits = torch.tensor(rng.normal(size=(len(params), v)) * 2, dtype=torch.float32)
    nums = [0, 3, 5, 1]
    wanted = [None, [7, 2], [], [0, 29, 1]]

    for original in (False, True):
        info = SamplingBatchInfo.from_params(params, v, prompt_token_ids=prompts, output_token_ids=outputs)
        out = Sampler(seed=0, return_original_logprob=original).sample(
            logits.clone(), info, return_logprob=True, top_logprobs_nums=nums, token_ids_logprobs=wanted
        )
        host = out.to_host()
        for i, p in enumerate(params):
            row = logits[i].numpy().astype(np.float64)
            if not original:
                # Penalties by hand (only the ones used above), then temperature.
                seen = set(prompts[i]) | set(outputs[i])
                for t in seen:
                    if p.repetition_penalty != 1.0:
                        row[t] = (
                            row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
                        )
                for t in outputs[i]:
                    row[t] -= p.frequency_penalty
                row = row / (1.0 if p.is_greedy else p.temperature)
            ref = ref_log_softmax(row)
            tok = host.next_token_ids[i]
            assert host.next_token_logprobs[i] == pytest.approx(ref[tok], abs=1e-4)
            top = np.argsort(-ref, kind="stable")[: nums[i]]
            assert host.top_logprobs_ids[i] == top.tolist()
            np.testing.assert_allclose(host.top_logprobs_vals[i], ref[top], atol=1e-4)
            ids = wanted[i] or []
            assert host.token_ids_logprobs_ids[i] == ids
            np.testing.assert_allclose(host.token_ids_logprobs_vals[i], ref[ids], atol=1e-4)


def test_logprobs_never_minus_inf():
    params = [SamplingParams(temperature=0.0, min_new_tokens=1)]
    info = SamplingBatchInfo.from_params(params, 4, eos_token_ids=[3])
    out = Sampler().sample(
        torch.tensor([[0.0, 1.0, 2.0, 9.0]]), info, return_logprob=True, token_ids_logprobs=[[3]]
    )
    host = out.to_host()
    assert host.next_token_ids == [2]  # EOS masked before min_new_tokens
    assert math.isfinite(host.token_ids_logprobs_vals[0][0]) and host.token_ids_logprobs_vals[0][0] < -1e30


def test_no_logprobs_by_default():
    info = SamplingBatchInfo.from_params([SamplingParams()], 5)
    out = Sampler().sample(torch.zeros(1, 5), info)
    assert out.next_token_logprobs is None and out.top_logprobs_ids is None
    assert out.next_token_ids.dtype == torch.int64


# ---------------------------------------------------------------------------- penalties in the sampler


def test_penalties_steer_greedy_choice():
    v = 6
    logits = torch.tensor([[0.0, 5.0, 4.5, 1.0, 0.0, -1.0]] * 3)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, repetition_penalty=2.0),  # 5 / 2 < 4.5
        SamplingParams(temperature=0.0, presence_penalty=1.0),  # 5 - 1 < 4.5
    ]
    info = SamplingBatchInfo.from_params(
        params, v, prompt_token_ids=[[1], [1], [1]], output_token_ids=[[], [], [1]]
    )
    assert Sampler().sample(logits.clone(), info).next_token_ids.tolist() == [1, 2, 2]


def test_min_new_tokens_blocks_eos_while_sampling():
    v = 5
    params = [SamplingParams(min_new_tokens=3, stop_token_ids=[1])] * 200
    info = SamplingBatchInfo.from_params(params, v, eos_token_ids=[0])
    sampler = Sampler(seed=0)
    logits = torch.tensor([[8.0, 8.0, 0.0, 0.0, 0.0]] * 200)
    for _ in range(3):
        ids = sampler.sample(logits.clone(), info).next_token_ids
        assert not bool(((ids == 0) | (ids == 1)).any())
        info.penalties.add_tokens(None, ids)
    ids = sampler.sample(logits.clone(), info).next_token_ids
    assert bool(((ids == 0) | (ids == 1)).all())


# ---------------------------------------------------------------------------- batch info


def test_batch_info_tensors_and_row_ops():
    v = 10
    params = [
        SamplingParams(temperature=0.0, top_k=3),
        SamplingParams(temperature=0.6, top_k=-1, top_p=0.9, min_p=0.1, seed=4),
        SamplingParams(top_k=50),
    ]
    info = SamplingBatchInfo.from_params(params, v)
    assert info.temperatures.tolist() == pytest.approx([1.0, 0.6, 1.0])
    assert info.top_ks.tolist() == [3, v, v]
    assert info.is_greedy.tolist() == [True, False, False]
    assert info.seeds == [None, 4, None]
    assert info.penalties is None
    assert not info.need_top_k and info.need_top_p and info.need_min_p

    other = SamplingBatchInfo.from_params(
        [SamplingParams(frequency_penalty=0.5, top_k=2)], v, output_token_ids=[[3]]
    )
    info.merge(other)
    assert len(info) == 4 and info.need_top_k and info.penalties is not None and len(info.penalties) == 4
    info.keep_rows([3, 1])
    assert info.top_ks.tolist() == [2, v] and info.seeds == [None, 4] and len(info.penalties) == 2
    info.keep_rows([1])
    assert info.penalties is None and not info.need_top_k

    # After row ops the batch samples like one built from scratch.
    logits = torch.randn(1, v, generator=torch.Generator().manual_seed(0))
    fresh = SamplingBatchInfo.from_params([params[1]], v)
    a = Sampler().sample(logits.clone(), info, steps=[2]).next_token_ids
    b = Sampler().sample(logits.clone(), fresh, steps=[2]).next_token_ids
    assert torch.equal(a, b)


def test_vocab_mask_restricts_sampling():
    v = 8
    params = [SamplingParams()] * 500
    info = SamplingBatchInfo.from_params(params, v)
    mask = torch.zeros(500, v, dtype=torch.bool)
    mask[:, [2, 5]] = True
    info.vocab_mask = mask
    ids = Sampler(seed=1).sample(torch.randn(500, v), info).next_token_ids
    assert set(ids.tolist()) == {2, 5}


def test_random_batches_smoke(candidates):
    """Random mixes of everything: tokens always lie in the reference support."""
    rnd = random.Random(9)
    v = 20
    for trial in range(20):
        params = []
        for _ in range(rnd.randrange(1, 9)):
            params.append(
                SamplingParams(
                    temperature=rnd.choice([0.0, 0.3, 1.0, 1.7]),
                    top_k=rnd.choice([-1, 1, 2, 7]),
                    top_p=rnd.choice([1.0, 0.6, 0.9]),
                    min_p=rnd.choice([0.0, 0.05, 0.3]),
                    seed=rnd.choice([None, rnd.randrange(1000)]),
                ).validate()
            )
        logits = well_separated_logits(np.random.default_rng(trial), v, params)
        info = SamplingBatchInfo.from_params(params, v)
        ids = Sampler(seed=trial).sample(logits.clone(), info, steps=[trial] * len(params)).next_token_ids
        for i, p in enumerate(params):
            assert ref_distribution(logits[i].numpy(), p)[ids[i].item()] > 0


def test_top_token_always_kept():
    # top_p=0 is rejected by validate(); the sampler still never empties the kept set.
    logits = torch.tensor([[0.1, 0.3, 2.0, -1.0]] * 50)
    info = SamplingBatchInfo.from_params([SamplingParams(top_p=0.0)] * 50, 4)
    assert set(Sampler(seed=0).sample(logits, info).next_token_ids.tolist()) == {2}


def test_ties_at_the_boundary_are_all_kept(candidates):
    # top-k=2 with the 2nd and 3rd logits tied; top-p whose boundary token is tied with the next.
    logits = torch.tensor([[3.0, 2.0, 2.0, 1.0, 0.0], [2.0, 1.0, 1.0, 0.0, -1.0]])
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.6)]
    probs = ref_softmax(logits[1].numpy())
    assert probs[0] < 0.6 < probs[0] + probs[1]  # the boundary is token 1, tied with token 2
    info = SamplingBatchInfo.from_params(params, 5)
    dist = sampling_distribution(logits, info)
    assert torch.nonzero(dist[0]).flatten().tolist() == [0, 1, 2]
    assert torch.nonzero(dist[1]).flatten().tolist() == [0, 1, 2]
