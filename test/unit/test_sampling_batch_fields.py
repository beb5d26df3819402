"""SamplingBatchInfo's per-row tensors (staged in one copy) against the requests' parameters written
out here: dtypes, values, and top-k counts exact at any vocabulary size."""

import pytest
import torch

from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo
from sgl_inkling.sampling.sampling_params import SamplingParams


@pytest.mark.parametrize("vocab", [201_024, 2**24 + 7])  # Inkling's; past float32's exact integers
def test_rows_carry_each_requests_parameters(vocab):
    specs = [
        {"temperature": 0.0},
        {"temperature": 0.7, "top_k": 5, "top_p": 0.9},
        {"temperature": 1.3, "min_p": 0.1},
        {"temperature": 0.5, "top_k": vocab - 2},  # odd and above 2^24 for the large vocabulary: not a float32
        {"temperature": 0.9, "top_k": vocab + 100},  # clamped to the vocabulary
    ]
    params = [SamplingParams.from_dict(s) for s in specs]
    info = SamplingBatchInfo.from_params(params, vocab)
    greedy = [s["temperature"] == 0.0 for s in specs]
    want = {
        "temperatures": ([1.0 if g else s["temperature"] for s, g in zip(specs, greedy)], torch.float32),
        "top_ps": ([s.get("top_p", 1.0) for s in specs], torch.float32),
        "min_ps": ([s.get("min_p", 0.0) for s in specs], torch.float32),
        "top_ks": ([min(s.get("top_k", vocab), vocab) for s in specs], torch.int64),
        "is_greedy": (greedy, torch.bool),
    }
    for name, (values, dtype) in want.items():
        got = getattr(info, name)
        assert got.dtype == dtype, name
        assert torch.equal(got, torch.tensor(values, dtype=dtype)), name
    assert info.is_all_greedy is False and info.any_greedy is True
