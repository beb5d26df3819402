"""The scheduler's batch log lines (upstream SGLang's format): "Decode batch." every --decode-log-interval
decode steps, counting the tokens the detokenizer received (counted here from the messages
themselves); "Prefill batch." every prefill step, counting every prompt token once."""

from __future__ import annotations

import logging
import re

import pytest

from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.sampling.sampling_params import SamplingParams
from sgl_inkling.server_args import ServerArgs

from .helpers import in_process_scheduler, random_prompt
from .test_overlap_schedule import Capture


class Sent(Capture):
    def close(self, linger: int = 0) -> None:
        pass

LINE = re.compile(
    r"Decode batch\. #running-req: (\d+), #token: (\d+), token usage: ([\d.]+), "
    r"gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+)$"
)


@pytest.mark.parametrize("overlap", [True, False])
def test_decode_lines_every_interval_count_the_tokens_sent(tiny_path, tmp_path_factory, caplog, overlap):
    interval, n_reqs, new = 4, 3, 13
    args = ServerArgs(model_path=str(tiny_path), device="cpu", decode_log_interval=interval,
                      disable_overlap_schedule=not overlap)  # fmt: skip
    with in_process_scheduler(args, tmp_path_factory) as s:
        s.send_sock.close(0)
        s.send_sock = cap = Sent()
        for i in range(n_reqs):
            sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": new, "ignore_eos": True})
            s.handle(TokenizedGenerateReq(rid=f"r{i}", input_ids=random_prompt(20 + i, seed=i), sampling_params=sp))
        decode_steps, lines, seen = 0, [], 0
        with caplog.at_level(logging.INFO, logger="sgl_inkling.managers.scheduler_log"):
            while s.waiting or s.partial or s.running or s.pending is not None:
                decoding = not (s.waiting or s.partial) and bool(s.running)
                s.step()
                s.flush_outbox()
                decode_steps += decoding
                new_lines = [r for r in caplog.records[seen:] if r.getMessage().startswith("Decode")]
                seen = len(caplog.records)
                lines += new_lines
                if new_lines:  # a line comes exactly at each interval's last decode step
                    assert decode_steps % interval == 0 and len(new_lines) == 1, (decode_steps, new_lines)
        sent = sum(len(ids) for m in cap.msgs for ids in (getattr(m, "new_token_ids", None) or []))
        assert sent == n_reqs * new == s.num_generated_tokens
        assert len(lines) == decode_steps // interval > 0
        parsed = [LINE.match(r.getMessage()) for r in lines]
        assert all(parsed), [r.getMessage() for r in lines]
        running = [int(m.group(1)) for m in parsed]
        assert running[0] == n_reqs and all(0 <= r <= n_reqs for r in running)
        prompts = sum(20 + i for i in range(n_reqs))
        assert int(parsed[0].group(2)) >= prompts  # KV in use holds at least the running prompts
        assert abs(float(parsed[0].group(3)) - int(parsed[0].group(2)) / s.kv.full.num_slots) <= 0.005
        # A window between two lines with every request running holds `interval` steps of n_reqs
        # tokens each: its rate times its length (the two records' times) gives them back.
        full = [i for i in range(1, len(lines)) if running[i - 1] == running[i] == n_reqs]
        assert full, running
        for i in full:
            tokens = float(parsed[i].group(4)) * (lines[i].created - lines[i - 1].created)
            assert tokens == pytest.approx(interval * n_reqs, rel=0.03), (i, tokens)


PREFILL = re.compile(
    r"Prefill batch\. #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), token usage: ([\d.]+), "
    r"#running-req: (\d+), #queue-req: (\d+)(?:, #mixed-decode: (\d+))?$"
)


def test_prefill_lines_count_every_prompt_token_once(tiny_path, tmp_path_factory, caplog):
    """Chunked prefill of prompts longer than a chunk, the second extending the first's prompt (so it
    reuses the cached prefix): the lines' new tokens add up to the prompts' tokens less what the
    outputs say was cached, each request is new in exactly one line."""
    chunk = 16
    args = ServerArgs(model_path=str(tiny_path), device="cpu", chunked_prefill_size=chunk,
                      max_prefill_tokens=chunk, disable_overlap_schedule=True)  # fmt: skip
    base = random_prompt(40, seed=3)
    prompts = [base, base + random_prompt(9, seed=4)]
    with in_process_scheduler(args, tmp_path_factory) as s:
        s.send_sock.close(0)
        s.send_sock = cap = Sent()
        lines = []
        with caplog.at_level(logging.INFO, logger="sgl_inkling.managers.scheduler_log"):
            for i, ids in enumerate(prompts):  # one after the other: the second finds the first cached
                sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 3, "ignore_eos": True})
                s.handle(TokenizedGenerateReq(rid=f"p{i}", input_ids=ids, sampling_params=sp))
                while s.waiting or s.partial or s.running or s.pending is not None:
                    s.step()
                    s.flush_outbox()
            lines = [PREFILL.match(r.getMessage()) for r in caplog.records if r.getMessage().startswith("Prefill")]
        assert all(lines) and len(lines) >= 4  # 40 tokens in chunks of 16: three steps for the first
        cached = {}
        for m in cap.msgs:
            for rid, c in zip(getattr(m, "rids", []), getattr(m, "cached_tokens", []) or []):
                cached[rid] = c
        assert cached["p0"] == 0 < cached["p1"]
        assert sum(int(m.group(1)) for m in lines) == len(prompts)
        assert sum(int(m.group(2)) for m in lines) == sum(map(len, prompts)) - sum(cached.values())
        assert sum(int(m.group(3)) for m in lines) == sum(cached.values())
        assert all(int(m.group(2)) <= chunk for m in lines)


def test_decode_lines_on_a_gpu_give_the_share_of_time_waiting_on_the_device(monkeypatch, caplog):
    """A window of 10 s in which HostCopy.wait blocked 7.5 s (a fake clock and a fake wait): the line
    ends with device wait 0.75; waits before the window opened (a prefill's) do not count."""
    from types import SimpleNamespace

    from sgl_inkling.managers import scheduler_log
    from sgl_inkling.sampling import host_copy

    clock = [100.0]
    monkeypatch.setattr(scheduler_log.time, "perf_counter", lambda: clock[0])
    sched = SimpleNamespace(num_generated_tokens=0, running=[1, 2], waiting=[], spec=None,
                            kv=SimpleNamespace(full=SimpleNamespace(num_slots=100, available=50)),
                            runner=SimpleNamespace(device=SimpleNamespace(type="cuda")))  # fmt: skip
    log = scheduler_log.DecodeLog(interval=2)
    monkeypatch.setattr(host_copy, "_waited", 3.0)  # before the window
    with caplog.at_level(logging.INFO, logger="sgl_inkling.managers.scheduler_log"):
        log.after_decode_step(sched)  # opens the window at t = 100
        monkeypatch.setattr(host_copy, "_waited", 7.5)
        clock[0], sched.num_generated_tokens = 110.0, 4
        log.after_decode_step(sched)
    msg = caplog.records[-1].getMessage()
    assert msg.endswith(", device wait: 0.75"), msg
    assert LINE.match(msg.removesuffix(", device wait: 0.75")), msg  # upstream's fields before it
