"""The /metrics collector on a scripted clock: what each hook observes, checked through the parsed
exposition (prometheus_client.parser), against numbers computed here from the script."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sgl_inkling.managers import metrics_collector as mc


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def parse(collector, state) -> dict:
    return {f.name: f for f in text_string_to_metric_families(collector.render(state).decode())}


def sample(families, name, **labels) -> float:
    for f in families.values():
        for s in f.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return s.value
    raise KeyError(name)


def run_request(c, clock, rid, chunks, stream, created, cached=0, prompt=10, queue=0.25, spec=None):
    """chunks: [(time, new tokens)]; the request finishes at the last chunk."""
    st = SimpleNamespace(created=created, queue_time=queue, spec=spec)
    c.received(SimpleNamespace(rid=rid, stream=stream, grammar=None), None, st)
    for t, n in chunks:
        clock.t = t
        c.output(rid, st, n)
    total = sum(n for _, n in chunks)
    meta = {"prompt_tokens": prompt, "completion_tokens": total, "cached_tokens": cached,
            "finish_reason": {"type": "length"}, "e2e_latency": clock.t - created}  # fmt: skip
    c.finished(rid, st, {"meta_info": meta, "text": ""})


def test_hooks_observe_ttft_itl_e2e_queue_and_counters(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(mc.time, "monotonic", clock)
    c = mc.MetricsCollector("m")
    # Streamed: first token at +0.5 s, then chunks of 4 tokens 0.2 s apart (ITL 0.05 s each).
    run_request(c, clock, "a", [(100.5, 1), (100.7, 4), (100.9, 4)], stream=True, created=100.0, cached=6)
    # Not streamed: the first token alone, then the rest (8 tokens) in one output 0.8 s later.
    run_request(c, clock, "b", [(101.2, 1), (102.0, 8)], stream=False, created=101.0, prompt=20)
    f = parse(c, {})
    m = {"model_name": "m"}
    assert sample(f, "sglang:num_requests_total", **m, is_streaming="true") == 1
    assert sample(f, "sglang:num_requests_total", **m, is_streaming="false") == 1
    assert sample(f, "sglang:prompt_tokens_total", **m, is_streaming="false") == 20
    assert sample(f, "sglang:generation_tokens_total", **m, is_streaming="true") == 9
    assert sample(f, "sglang:cached_tokens_total", **m, cache_source="device") == 6
    assert sample(f, "sglang:time_to_first_token_seconds_sum", is_streaming="true") == pytest.approx(0.5)
    assert sample(f, "sglang:time_to_first_token_seconds_sum", is_streaming="false") == pytest.approx(0.2)
    assert sample(f, "sglang:inter_token_latency_seconds_count") == 8 + 8
    assert sample(f, "sglang:inter_token_latency_seconds_sum") == pytest.approx(8 * 0.05 + 8 * 0.1)
    assert sample(f, "sglang:inter_token_latency_seconds_bucket", le="0.06") == 8  # a's gaps, not b's
    assert sample(f, "sglang:e2e_request_latency_seconds_sum", is_streaming="true") == pytest.approx(0.9)
    assert sample(f, "sglang:request_time_per_output_token_seconds_sum", is_streaming="false") == pytest.approx(0.1)
    assert sample(f, "sglang:queue_time_seconds_count") == 2
    assert sample(f, "sglang:cache_hit_rate", **m) == pytest.approx(6 / 30)
    assert sample(f, "sglang:gen_throughput", **m) == pytest.approx(18 / mc.THROUGHPUT_WINDOW_S)
    clock.t += mc.THROUGHPUT_WINDOW_S + 1
    assert sample(parse(c, {}), "sglang:gen_throughput", **m) == 0  # nothing generated lately


def test_scheduler_gauges_from_state_and_mtp(monkeypatch):
    c = mc.MetricsCollector("m")
    state = {"num_running_reqs": 3, "num_waiting_reqs": 2, "full_kv_total": 100, "full_kv_available": 60,
             "radix_cached_tokens": 15, "swa_kv_total": 50, "swa_kv_available": 40, "radix_swa_tokens": 5,
             "num_retracted_reqs": 4, "context_len": 4096}  # fmt: skip
    f = parse(c, state)
    assert sample(f, "sglang:num_running_reqs") == 3 and sample(f, "sglang:num_queue_reqs") == 2
    assert sample(f, "sglang:kv_used_tokens") == 100 - 60 - 15 and sample(f, "sglang:token_usage") == 0.25
    assert sample(f, "sglang:swa_token_usage") == pytest.approx(5 / 50)
    assert sample(f, "sglang:num_retracted_requests_total") == 4 and f["sglang:num_retracted_requests"].type == "counter"
    assert "sglang:spec_accept_length" not in f  # no MTP, no MTP gauges
    f = parse(c, {**state, "avg_spec_accept_length": 2.5, "speculative_num_steps": 3})
    assert sample(f, "sglang:spec_accept_length") == 2.5 and sample(f, "sglang:spec_num_steps") == 3
    # spec_verify_calls counts the verify steps of finished requests.
    clock = Clock()
    monkeypatch.setattr(mc.time, "monotonic", clock)
    run_request(c, clock, "s", [(100.1, 3)], stream=False, created=100.0, spec=(2, 1))
    assert sample(parse(c, state), "sglang:spec_verify_calls_total") == 2
