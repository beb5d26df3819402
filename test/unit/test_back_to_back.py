"""benchmark/back_to_back.py against figures worked by hand (issue 20's own example among them)."""

from __future__ import annotations

import pytest

from benchmark.back_to_back import back_to_back, step_ms

ROOMY = {"max_running_requests": 256, "max_total_num_tokens": 10**8}


def test_issue_20_example():
    """64 prefills of 8K at 0.22 s, then 1,024 steps of a batch of 64 at 17.3 ms: about 2,060 tok/s."""
    engine = {"prefill_ms": 220.0, "input_len": 8192, "decode_step_ms": {"1": 1.83, "64": 17.3}}
    b = back_to_back(engine, 64, 64, 8192, 1024, ROOMY)
    assert b["duration_s"] == pytest.approx(64 * 0.22 + 1024 * 0.0173)
    assert round(b["output_throughput"], -1) == 2060
    assert b["wave_size"] == 64 and b["waves"] == 1 and b["prefill_all_s"] == pytest.approx(14.08)
    assert b["decode_steps_measured_at_wave_sizes"] and not b["input_len_scaled"]


def test_waves_limited_by_kv_memory_and_interpolated_steps():
    engine = {"prefill_ms": 100.0, "input_len": 1000, "decode_step_ms": {"16": 10.0, "64": 22.0}}
    # 1,100 tokens per request; 40,000 slots hold 36 requests: waves of 36 and 28 for 64 prompts.
    b = back_to_back(engine, 256, 64, 1000, 100, {"max_running_requests": 256, "max_total_num_tokens": 40_000})
    assert b["wave_size"] == 36 and b["waves"] == 2 and b["wave_limited_by"] == ["fit_in_kv"]
    s36, s28 = 10 + 12 * 20 / 48, 10 + 12 * 12 / 48
    assert b["duration_s"] == pytest.approx((64 * 100 + 100 * (s36 + s28)) / 1e3)
    assert not b["decode_steps_measured_at_wave_sizes"]


def test_step_interpolation_and_extrapolation():
    table = {"16": 10.0, "64": 22.0, "128": 30.0}
    assert step_ms(table, 64) == (22.0, True)
    assert step_ms(table, 96) == (26.0, False)
    assert step_ms(table, 8) == (8.0, False)  # below the table: the first two points' line
    assert step_ms(table, 256) == (46.0, False)  # above it: the last two points' line
