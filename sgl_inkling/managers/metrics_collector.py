"""/metrics (--enable-metrics): Prometheus metrics through prometheus_client, with upstream SGLang's
names, types, buckets and labels (`model_name`, and `is_streaming` where upstream has it).

Request metrics (token counters, TTFT / inter-token / e2e / queue-time histograms) are observed in the
tokenizer manager as outputs arrive; the scheduler's gauges (running and queued requests, KV pool
usage, retractions, MTP accept length) are read from its internal state at each scrape.
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = TTFT_BUCKETS + [600, 1200, 1800, 2400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0]  # fmt: skip
QUEUE_BUCKETS = [0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50,
                 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800,
                 2000, 2500]  # fmt: skip
THROUGHPUT_WINDOW_S = 10.0  # sglang:gen_throughput: tokens generated over the last this many seconds


class MetricsCollector:
    """Observer of the tokenizer manager's requests (received / output / finished) and the registry."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        r, m, ms = self.registry, ["model_name"], ["model_name", "is_streaming"]
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", ms, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Number of generation tokens processed.",
                                         ms, registry=r)  # fmt: skip
        self.cached_tokens = Counter("sglang:cached_tokens", "Number of cached prompt tokens by source.",
                                     m + ["cache_source"], registry=r)  # fmt: skip
        self.num_requests = Counter("sglang:num_requests", "Number of requests processed.", ms, registry=r)
        self.num_so_requests = Counter("sglang:num_so_requests", "Number of structured output requests processed.",
                                       m, registry=r)  # fmt: skip
        self.num_aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted.", m, registry=r)
        self.spec_verify_calls = Counter("sglang:spec_verify_calls", "Number of speculative decoding verification "
                                         "calls.", m, registry=r)  # fmt: skip
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              ms, buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             m, buckets=ITL_BUCKETS, registry=r)  # fmt: skip
        self.tpot = Histogram("sglang:request_time_per_output_token_seconds", "Per-request TPOT in seconds: "
                              "(finished_time - first_token_time) / (completion_tokens - 1).", ms,
                              buckets=ITL_BUCKETS, registry=r)  # fmt: skip
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in "
                             "seconds", ms, buckets=E2E_BUCKETS, registry=r)  # fmt: skip
        self.queue_time = Histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", m,
                                    buckets=QUEUE_BUCKETS, registry=r)  # fmt: skip
        self.scheduler = _SchedulerMetrics(self)
        r.register(self.scheduler)
        self._live: dict[str, dict] = {}  # rid -> is_streaming, has_grammar, first/last token times
        self._recent: deque[tuple[float, int]] = deque()  # (time, new tokens) for gen_throughput
        self.prompt_total = self.cached_total = 0  # for cache_hit_rate

    # -- observer hooks (called by the tokenizer manager) -----------------------------------------

    def received(self, tok, obj, st) -> None:
        self._live[tok.rid] = {"stream": tok.stream, "grammar": tok.grammar is not None, "first": None, "last": None}

    def output(self, rid: str, st, n_new: int) -> None:
        live = self._live.get(rid)
        if live is None or n_new <= 0:
            return
        now = time.monotonic()
        self._recent.append((now, n_new))
        gaps = n_new
        if live["first"] is None:
            live["first"] = now
            self.ttft.labels(self.model_name, _flag(live["stream"])).observe(now - st.created)
            gaps -= 1  # the first token's latency is the TTFT, not an inter-token gap
        if gaps > 0:
            start = live["last"] if live["last"] is not None else st.created
            itl = self.itl.labels(self.model_name)
            for _ in range(gaps):  # a chunk of several tokens: its interval, shared out
                itl.observe((now - start) / n_new)
        live["last"] = now

    def finished(self, rid: str, st, result: dict) -> None:
        live = self._live.pop(rid, None)
        if live is None:
            return
        meta, name, stream = result["meta_info"], self.model_name, _flag(live["stream"])
        prompt, completion, cached = meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]
        self.prompt_tokens.labels(name, stream).inc(prompt)
        self.generation_tokens.labels(name, stream).inc(completion)
        if cached:
            self.cached_tokens.labels(name, "device").inc(cached)
        self.prompt_total += prompt
        self.cached_total += cached
        self.num_requests.labels(name, stream).inc()
        if live["grammar"]:
            self.num_so_requests.labels(name).inc()
        reason = meta.get("finish_reason")
        if reason is None or reason.get("type") == "abort":
            self.num_aborted.labels(name).inc()
        self.e2e.labels(name, stream).observe(meta["e2e_latency"])
        if completion > 1 and live["first"] is not None:
            self.tpot.labels(name, stream).observe((live["last"] - live["first"]) / (completion - 1))
        if st.queue_time is not None:
            self.queue_time.labels(name).observe(st.queue_time)
        if st.spec is not None and st.spec[0]:
            self.spec_verify_calls.labels(name).inc(st.spec[0])

    # -- scrape -----------------------------------------------------------------------------------

    def gen_throughput(self) -> float:
        now = time.monotonic()
        while self._recent and now - self._recent[0][0] > THROUGHPUT_WINDOW_S:
            self._recent.popleft()
        return sum(n for _, n in self._recent) / THROUGHPUT_WINDOW_S

    def render(self, state: dict) -> bytes:
        self.scheduler.state = state
        return generate_latest(self.registry)


def _flag(value: bool) -> str:
    return "true" if value else "false"


class _SchedulerMetrics:
    """Gauges (and the retraction counter) from the scheduler's internal state of the last scrape."""

    def __init__(self, owner: MetricsCollector):
        self.owner = owner
        self.state: dict = {}

    def describe(self):
        return []  # families depend on the state (MTP ones only with MTP); nothing to pre-register

    def collect(self):
        s, o = self.state, self.owner
        full_total, swa_total = s.get("full_kv_total", 0), s.get("swa_kv_total", 0)
        full_free, swa_free = s.get("full_kv_available", 0), s.get("swa_kv_available", 0)
        full_cached, swa_cached = s.get("radix_cached_tokens", 0), s.get("radix_swa_tokens", 0)
        full_used = max(full_total - full_free - full_cached, 0)
        swa_used = max(swa_total - swa_free - swa_cached, 0)
        gauges = {
            "num_running_reqs": ("The number of running requests.", s.get("num_running_reqs", 0)),
            "num_queue_reqs": ("The number of requests in the waiting queue.", s.get("num_waiting_reqs", 0)),
            "gen_throughput": ("The generation throughput (token/s).", o.gen_throughput()),
            "cache_hit_rate": ("The prefix cache hit rate.", o.cached_total / o.prompt_total if o.prompt_total else 0.0),
            "token_usage": ("The token usage.", full_used / full_total if full_total else 0.0),
            "full_token_usage": ("The token usage for full attention layers.",
                                 full_used / full_total if full_total else 0.0),
            "swa_token_usage": ("The token usage for SWA layers.", swa_used / swa_total if swa_total else 0.0),
            "num_used_tokens": ("The number of used tokens.", full_used),
            "kv_available_tokens": ("Number of free token slots in the KV cache pool.", full_free),
            "kv_evictable_tokens": ("Number of evictable (radix-cached) token slots in the KV cache pool.",
                                    full_cached),
            "kv_used_tokens": ("Number of actively used token slots in the KV cache pool.", full_used),
            "swa_available_tokens": ("Number of free token slots in the SWA pool (hybrid-SWA only).", swa_free),
            "swa_evictable_tokens": ("Number of evictable (radix-cached) token slots in the SWA pool.", swa_cached),
            "swa_used_tokens": ("Number of actively used token slots in the SWA pool.", swa_used),
            "num_retracted_reqs": ("The number of retracted requests.", s.get("num_retracted_reqs", 0)),
            "max_total_num_tokens": ("Maximum total number of tokens in the KV cache pool.", full_total),
            "max_total_num_tokens_swa": ("Maximum total number of tokens in the SWA KV pool.", swa_total),
            "context_len": ("The context length of the model.", s.get("context_len", 0)),
            "page_size": ("The number of tokens in a page.", 1),
        }  # fmt: skip
        if "avg_spec_accept_length" in s:
            gauges["spec_accept_length"] = (
                "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
                s["avg_spec_accept_length"],
            )
            gauges["spec_num_steps"] = ("Currently active speculative_num_steps.", s.get("speculative_num_steps", 0))
        for key, (doc, value) in gauges.items():
            g = GaugeMetricFamily(f"sglang:{key}", doc, labels=["model_name"])
            g.add_metric([o.model_name], float(value))
            yield g
        c = CounterMetricFamily("sglang:num_retracted_requests", "Total number of retracted requests.",
                                labels=["model_name"])  # fmt: skip
        c.add_metric([o.model_name], float(s.get("num_retracted_reqs", 0)))
        yield c
