"""--decode-log-interval: the scheduler's "Decode batch." lines (upstream SGLang's format) come every N
decode steps, and the tokens their throughput counts are those the detokenizer received (counted
here from the messages themselves)."""

from __future__ import annotations

import logging
import re
import time

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
        decode_steps, lines, t0 = 0, [], time.perf_counter()
        with caplog.at_level(logging.INFO, logger="sgl_inkling.managers.scheduler_log"):
            while s.waiting or s.partial or s.running or s.pending is not None:
                decoding = not (s.waiting or s.partial) and bool(s.running)
                s.step()
                s.flush_outbox()
                decode_steps += decoding
                new_lines = [r.getMessage() for r in caplog.records[len(lines):]]
                lines += new_lines
                if new_lines:  # a line comes exactly at each interval's last decode step
                    assert decode_steps % interval == 0 and len(new_lines) == 1, (decode_steps, new_lines)
        elapsed = time.perf_counter() - t0
        sent = sum(len(ids) for m in cap.msgs for ids in (getattr(m, "new_token_ids", None) or []))
        assert sent == n_reqs * new == s.num_generated_tokens
        assert len(lines) == decode_steps // interval > 0
        parsed = [LINE.match(line) for line in lines]
        assert all(parsed), lines
        running = [int(m.group(1)) for m in parsed]
        assert running[0] == n_reqs and all(0 <= r <= n_reqs for r in running)
        prompts = sum(20 + i for i in range(n_reqs))
        assert int(parsed[0].group(2)) >= prompts  # KV in use holds at least the running prompts
        assert abs(float(parsed[0].group(3)) - int(parsed[0].group(2)) / s.kv.full.num_slots) <= 0.005
        # The first window starts at the first decode step, not at start-up: its rate is at least the
        # whole run's average (prefill included).
        assert float(parsed[0].group(4)) >= n_reqs * new / elapsed
