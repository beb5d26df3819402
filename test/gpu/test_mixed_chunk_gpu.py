"""Mixed chunked prefill on CUDA (Triton backend, CUDA graphs for plain decode steps), inkling-tiny in
fp32: the riders' decode tokens go through the extend kernels, so their greedy tokens and logprobs
must match the run without mixing (decode kernels, graphs) for the same arrivals."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from test.unit.helpers import close_scheduler  # noqa: E402
from test.unit.test_mixed_chunk import drive, make_scheduler, workload  # noqa: E402


def _drive_once(tiny_path, tmp_path_factory, mixed: bool):
    # A fixed cache size: sized from free memory (0.85 of the GPU) the first in-process scheduler's
    # pools stayed reserved in this process at bb49f80 and the second could not size at all.
    s = make_scheduler(tiny_path, tmp_path_factory, mixed, dtype="float32", device="cuda", max_total_tokens=8192)
    try:
        sched = {i: [kw for kw in batch if kw["rid"] != "seeded"] for i, batch in workload().items()}
        rec = drive(s, sched)
        assert (s.mixed_counts["num_mixed_steps"] > 0) == mixed
        return rec
    finally:
        close_scheduler(s)


def test_mixed_greedy_tokens_and_logprobs_match_plain_on_cuda(tiny_path, tmp_path_factory):
    recs = []
    for mixed in (True, False):
        recs.append(_drive_once(tiny_path, tmp_path_factory, mixed))
    mixed, plain = recs
    assert mixed.tokens == plain.tokens and len(mixed.tokens) == 6
    for rid, lps in mixed.lps.items():
        torch.testing.assert_close(torch.tensor([x for x, _ in lps]), torch.tensor([x for x, _ in plain.lps[rid]]),
                                   atol=1e-3, rtol=1e-3)  # fmt: skip
    for rid, inp in mixed.inputs.items():
        torch.testing.assert_close(torch.tensor([x or 0.0 for x, _ in inp]), torch.tensor([x or 0.0 for x, _ in plain.inputs[rid]]),
                                   atol=1e-3, rtol=1e-3)  # fmt: skip
