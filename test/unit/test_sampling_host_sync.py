"""The sampling path reads nothing back from the device: building the batch, penalties, filters,
seeded and unseeded draws, logprobs and row removal run without .item() / .tolist() / .cpu() /
bool(tensor) / nonzero / multinomial; only SampleOutput.to_host() reads. On CPU those calls are
forbidden by patching them to raise; test/gpu/test_sampler_sync.py runs the same scenario on CUDA
under torch.cuda.set_sync_debug_mode("error"), which also catches blocking host-to-device copies."""

from __future__ import annotations

import contextlib

import pytest
import torch

from sgl_inkling.sampling.sampler import Sampler
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo
from sgl_inkling.sampling.sampling_params import SamplingParams

VOCAB = 2048  # above the sampler's top-k candidate width, so the full-sort path runs too
PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, top_k=20),  # candidate (topk) path
    SamplingParams(temperature=1.0, top_p=0.9),  # full-sort path
    SamplingParams(temperature=0.9, min_p=0.1, seed=123),
    SamplingParams(temperature=0.8, top_k=50, top_p=0.8, min_p=0.05, seed=7, repetition_penalty=1.2,
                   frequency_penalty=0.3, presence_penalty=0.2, logit_bias={5: 2.0, 9: -1.0},
                   min_new_tokens=3, stop_token_ids=[11]),  # fmt: skip
    SamplingParams(temperature=0.0, logit_bias={150: 1.5}),
]
ALLOWED_ROW5 = range(100, 200)  # a grammar mask on the last row


def scenario(device: str, no_sync=contextlib.nullcontext, vocab: int = VOCAB):
    """Two sampling steps with a row removal in between; returns the host outputs and the logits."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(PARAMS), vocab, generator=gen) * 3
    logits2 = torch.randn(3, vocab, generator=gen) * 3
    mask = torch.ones(len(PARAMS), vocab, dtype=torch.bool)
    mask[5] = False
    mask[5, ALLOWED_ROW5] = True
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [5, 9, 11, 12], [13]]
    outputs = [[], [14], [], [15, 16], [5], []]
    dev = [t.to(device) for t in (logits, logits2, mask)]
    sampler = Sampler(seed=1)
    with no_sync():
        info = SamplingBatchInfo.from_params(PARAMS, vocab, device, prompt_token_ids=prompts,
                                             output_token_ids=outputs, eos_token_ids=[2])  # fmt: skip
        info.vocab_mask = dev[2]
        first = sampler.sample(dev[0].clone(), info, steps=[len(o) for o in outputs], return_logprob=True,
                               top_logprobs_nums=[0, 3, 0, 5, 1, 2],
                               token_ids_logprobs=[None, [1, 2], [], None, [3], [150, 5]])  # fmt: skip
        info.penalties.add_tokens(None, first.next_token_ids)
        info.keep_rows([4, 1, 3])
        second = sampler.sample(dev[1].clone(), info, steps=[2, 2, 3], return_logprob=True)
    return first.to_host(), second.to_host(), logits


def forbid(name: str):
    def raiser(*_a, **_k):
        raise AssertionError(f"host read on the sampling path: {name}")

    return raiser


@contextlib.contextmanager
def no_host_reads():
    mp = pytest.MonkeyPatch()
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "nonzero"):
        mp.setattr(torch.Tensor, name, forbid(f"Tensor.{name}"))
    for name in ("multinomial", "nonzero"):
        mp.setattr(torch, name, forbid(f"torch.{name}"))
    try:
        yield
    finally:
        mp.undo()


def test_patch_catches_a_host_read():
    with pytest.raises(AssertionError, match="Tensor.tolist"), no_host_reads():
        torch.zeros(2).tolist()


def check(first, second, logits: torch.Tensor) -> None:
    ids = first.next_token_ids
    assert ids[0] == int(logits[0].argmax())  # greedy, no penalties on that row
    assert ids[1] in logits[1].topk(20).indices.tolist()
    biased = logits[5].clone()
    biased[150] += 1.5
    assert ids[5] == ALLOWED_ROW5.start + int(biased[ALLOWED_ROW5.start : ALLOWED_ROW5.stop].argmax())
    assert len(first.top_logprobs_ids[3]) == 5 and first.top_logprobs_ids[0] == []
    assert [len(v) for v in first.token_ids_logprobs_vals] == [0, 2, 0, 0, 1, 2]
    assert len(second.next_token_ids) == 3 and all(0 <= t < logits.shape[1] for t in second.next_token_ids)


def test_sampling_path_reads_nothing_back_on_cpu():
    first, second, logits = scenario("cpu", no_host_reads)
    check(first, second, logits)
