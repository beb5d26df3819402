"""MTP's sampled acceptance (rejection sampling after the verify graph) on CUDA never waits for the
device: under torch.cuda.set_sync_debug_mode("error") the whole rule runs (batch tensors, filters,
draws); the step's one read (Accepted.to_host) is the only sync. Greedy rows follow the argmax rule."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from sgl_inkling.sampling.sampling_params import SamplingParams  # noqa: E402
from sgl_inkling.speculative.acceptance import greedy_accept, sample_accept  # noqa: E402

from .test_sampler_sync import sync_is_error  # noqa: E402


@pytest.mark.parametrize("vocab", [1000, 201024])
def test_sample_accept_never_syncs(vocab):
    g = torch.Generator(device="cuda").manual_seed(0)
    b, r = 6, 9
    logits = torch.randn(b, r, vocab, device="cuda", generator=g) * 4
    ids = torch.randint(0, vocab, (b, r), device="cuda", generator=g)
    ids[:, 1:] = logits[:, :-1].argmax(-1)  # drafts the trunk agrees with: long accepts
    params = [SamplingParams.from_dict(d) for d in (
        {"temperature": 0}, {"temperature": 0.7}, {"temperature": 1.0, "top_k": 3},
        {"temperature": 1.0, "top_p": 0.9}, {"temperature": 0.5, "min_p": 0.1}, {"temperature": 1.0, "top_k": 5000},
    )]  # fmt: skip
    limits = torch.full((b,), r - 1, dtype=torch.int64, device="cuda")
    sample_accept(logits, ids, params, limits)  # warm-up: kernels, pinned-memory pool
    torch.cuda.synchronize()
    with sync_is_error():
        acc = sample_accept(logits, ids, params, limits)
    got = acc.to_host()
    want = greedy_accept(logits[:1], ids[:1], limits[:1]).to_host()
    assert got[0] == want[0]
    assert all(1 <= len(c) <= r for c in got)
