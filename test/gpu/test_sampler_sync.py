"""The sampling path on CUDA under torch.cuda.set_sync_debug_mode("error"): no step of it (batch
tensors, penalties, filters, seeded draws, logprobs, row removal) may wait for the device, including
blocking host-to-device copies; results agree with the same scenario on the CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from test.unit.test_sampling_host_sync import VOCAB, check, scenario  # noqa: E402


@contextlib.contextmanager
def sync_is_error():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("vocab", [VOCAB, 201024])  # small, and Inkling's (the sort takes other kernels)
def test_sampling_path_never_syncs_on_cuda(vocab):
    scenario("cuda", vocab=vocab)  # warm-up: CUDA context, pinned-memory pool, kernels
    with pytest.raises(RuntimeError), sync_is_error():  # the mode does catch a read-back
        torch.ones(1, device="cuda").item()
    first, second, logits = scenario("cuda", sync_is_error, vocab)
    check(first, second, logits)
    cpu_first, _, _ = scenario("cpu", vocab=vocab)
    # Greedy rows and the top logprobs (taken before any draw) do not depend on the random streams.
    for row in (0, 5):
        assert first.next_token_ids[row] == cpu_first.next_token_ids[row]
        assert first.next_token_logprobs[row] == pytest.approx(cpu_first.next_token_logprobs[row], abs=1e-4)
    for row in (1, 3, 4):
        assert first.top_logprobs_ids[row] == cpu_first.top_logprobs_ids[row]
        assert first.top_logprobs_vals[row] == pytest.approx(cpu_first.top_logprobs_vals[row], abs=1e-4)
