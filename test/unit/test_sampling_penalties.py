"""PenaltyState against a plain per-token Python loop."""

import math
import random
from collections import Counter

import pytest
import torch

from sgl_inkling.sampling.penalties import PenaltyState
from sgl_inkling.sampling.sampling_params import SamplingParams

V = 23
EOS = [21, 22]


def reference(row, prompt, output, p: SamplingParams, eos):
    """The documented order: repetition, frequency, presence, logit_bias, min_new_tokens."""
    counts = Counter(output)
    seen = set(prompt) | set(output)
    stop = set(eos) | set(p.stop_token_ids or [])
    bias = {int(k): float(v) for k, v in (p.logit_bias or {}).items()}
    out = []
    for tok, x in enumerate(row):
        x = float(x)
        if tok in seen:
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        x -= p.frequency_penalty * counts[tok]
        if counts[tok] > 0:
            x -= p.presence_penalty
        x += bias.get(tok, 0.0)
        if len(output) < p.min_new_tokens and tok in stop:
            x = -math.inf
        out.append(x)
    return out


def assert_rows_match(got: torch.Tensor, expected: list[list[float]]):
    exp = torch.tensor(expected, dtype=torch.float64)
    got = got.to(torch.float64)
    inf_e, inf_g = torch.isinf(exp), torch.isinf(got)
    assert torch.equal(inf_e, inf_g)
    torch.testing.assert_close(got[~inf_g], exp[~inf_e], rtol=1e-5, atol=1e-5)


PARAMS = [
    SamplingParams(),
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.7, frequency_penalty=0.4),
    SamplingParams(frequency_penalty=-0.3, presence_penalty=1.5),
    SamplingParams(presence_penalty=-0.8, logit_bias={"3": 2.5, 7: -100}),
    SamplingParams(min_new_tokens=3, stop_token_ids=[5, 6]),
    SamplingParams(repetition_penalty=1.8, frequency_penalty=2.0, presence_penalty=2.0, min_new_tokens=2),
]


def test_matches_reference_over_steps():
    rng = random.Random(0)
    prompts = [[rng.randrange(V) for _ in range(rng.randrange(0, 8))] for _ in PARAMS]
    outputs = [[rng.randrange(V) for _ in range(rng.randrange(0, 3))] for _ in PARAMS]
    state = PenaltyState(V)
    state.add_requests(PARAMS, prompts, [list(o) for o in outputs], eos_token_ids=EOS)
    assert state.is_active
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        logits = torch.randn(len(PARAMS), V, generator=g) * 3
        expected = [
            reference(logits[i].tolist(), prompts[i], outputs[i], p, EOS) for i, p in enumerate(PARAMS)
        ]
        got = state.apply(logits.clone())
        assert_rows_match(got, expected)
        if step % 2 == 0:
            # Decode step: one token for every row; repeats make counts > 1.
            toks = [rng.choice([1, 2, 3, rng.randrange(V)]) for _ in PARAMS]
            state.add_tokens(None, torch.tensor(toks))
            for o, t in zip(outputs, toks):
                o.append(t)
        else:
            # Only some rows advance (and one of them twice), via explicit row indices.
            rows = [0, 2, 2, 5]
            toks = [rng.randrange(V) for _ in rows]
            state.add_tokens(rows, toks)
            for r, t in zip(rows, toks):
                outputs[r].append(t)


def test_min_new_tokens_masks_stop_ids_until_reached():
    p = SamplingParams(min_new_tokens=2, stop_token_ids=[4])
    state = PenaltyState(V)
    state.add_requests([p, SamplingParams(min_new_tokens=1)], eos_token_ids=[9])
    assert state.use_min_new_tokens and not state.use_repetition
    assert state.counts is None and state.prompt_mask is None  # no dense state needed

    def masked(row):
        out = state.apply(torch.zeros(2, V))
        return sorted(torch.nonzero(torch.isinf(out[row])).flatten().tolist())

    assert masked(0) == [4, 9] and masked(1) == [9]
    state.add_tokens(None, [1, 1])
    assert masked(0) == [4, 9] and masked(1) == []
    state.add_tokens([0], [1])
    assert masked(0) == [] and masked(1) == []


def _history_state(params, prompts, outputs):
    s = PenaltyState(V)
    s.add_requests(params, prompts, outputs, eos_token_ids=EOS)
    return s


def test_keep_remove_merge_equal_fresh_state():
    rng = random.Random(3)
    prompts = [[rng.randrange(V) for _ in range(5)] for _ in PARAMS]
    outputs = [[rng.randrange(V) for _ in range(rng.randrange(0, 4))] for _ in PARAMS]
    a = _history_state(PARAMS, prompts, outputs)
    logits = torch.randn(len(PARAMS), V, generator=torch.Generator().manual_seed(5)) * 2

    keep = [6, 1, 4]
    a.keep_rows(keep)
    fresh = _history_state([PARAMS[i] for i in keep], [prompts[i] for i in keep], [outputs[i] for i in keep])
    torch.testing.assert_close(a.apply(logits[keep].clone()), fresh.apply(logits[keep].clone()))

    # Merge with a penalty-free batch (no dense state) and with a batch that has it.
    plain = _history_state([SamplingParams()], [[1, 2]], [[3]])
    assert plain.counts is None
    a.merge(plain)
    b = _history_state([PARAMS[2], PARAMS[5]], [prompts[2], prompts[5]], [outputs[2], outputs[5]])
    a.merge(b)
    rows = keep + [0, 2, 5]
    all_params = [PARAMS[i] for i in keep] + [SamplingParams(), PARAMS[2], PARAMS[5]]
    all_prompts = [prompts[i] for i in keep] + [[1, 2], prompts[2], prompts[5]]
    all_outputs = [outputs[i] for i in keep] + [[3], outputs[2], outputs[5]]
    x = logits[rows].clone()
    expected = [
        reference(x[i].tolist(), all_prompts[i], all_outputs[i], p, EOS) for i, p in enumerate(all_params)
    ]
    assert_rows_match(a.apply(x.clone()), expected)

    a.remove_rows([0, 3])
    left = [1, 2, 4, 5]
    expected = [reference(x[i].tolist(), all_prompts[i], all_outputs[i], all_params[i], EOS) for i in left]
    assert_rows_match(a.apply(x[left].clone()), expected)


def test_state_allocated_lazily_and_freed():
    s = PenaltyState(V)
    s.add_requests([SamplingParams(), SamplingParams()])
    assert not s.is_active and s.counts is None
    logits = torch.randn(2, V)
    assert torch.equal(s.apply(logits.clone()), logits)
    # A later row that needs counts: earlier rows get zero rows, which they never read.
    s.add_requests([SamplingParams(frequency_penalty=1.0)], output_token_ids=[[0, 0, 1]])
    assert s.counts is not None and s.counts.shape == (3, V)
    assert s.counts[2, 0].item() == 2 and s.counts[:2].sum().item() == 0
    s.keep_rows([0, 1])
    assert s.counts is None


def test_out_of_vocab_ids_rejected():
    s = PenaltyState(V)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        s.add_requests([SamplingParams(repetition_penalty=1.1)], [[V]])
    with pytest.raises(ValueError, match="logit_bias"):
        PenaltyState(V).add_requests([SamplingParams(logit_bias={V + 1: 1.0})])
    with pytest.raises(ValueError, match="stop_token_ids"):
        PenaltyState(V).add_requests([SamplingParams(min_new_tokens=1, stop_token_ids=[V])])


def test_shape_checks():
    s = PenaltyState(V)
    s.add_requests([SamplingParams(presence_penalty=1.0)])
    with pytest.raises(ValueError):
        s.apply(torch.zeros(2, V))
    with pytest.raises(ValueError):
        s.apply(torch.zeros(1, V + 1))
    with pytest.raises(ValueError):
        s.add_tokens(None, [1, 2])
