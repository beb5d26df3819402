"""The scheduler's batch log lines, as upstream SGLang writes them. Every prefill (or mixed) step:

    Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.05, #running-req: 12, #queue-req: 51

and every --decode-log-interval decode steps:

    Decode batch. #running-req: 64, #token: 590208, token usage: 0.44, gen throughput (token/s): 6402.11, #queue-req: 0

gen throughput is the tokens the scheduler committed since the last line over the wall time since
then, measured where they are produced: against a client's figures it tells whether the engine or
what lies after it (detokenizer, HTTP, client) sets the pace. On a GPU the line ends with
`device wait: 0.78`, the share of that time the host spent blocked reading sampled tokens back: near
its usual value the device sets the step time; when steps lengthen while it falls, the host does.
"""

from __future__ import annotations

import logging
import time

from sgl_inkling.sampling.host_copy import take_waited

logger = logging.getLogger(__name__)


def _usage(sched) -> tuple[int, float]:
    kv = sched.kv.full
    used = kv.num_slots - kv.available
    return used, used / max(kv.num_slots, 1)


def log_prefill(sched, batch: list, new_seqs: list, riders: list) -> None:
    """One line per prefill step: the sequences it admitted, the prompt tokens it computes (chunks of
    earlier ones included), the cached tokens the admitted reuse; running requests (riders among
    them) and the queue left behind."""
    if not logger.isEnabledFor(logging.INFO):
        return
    _, usage = _usage(sched)
    line = (f"Prefill batch. #new-seq: {len(new_seqs)}, #new-token: {sum(n for _, n, _ in batch)}, "
            f"#cached-token: {sum(r.cached_tokens for r in new_seqs)}, token usage: {usage:.2f}, "
            f"#running-req: {len(sched.running)}, #queue-req: {len(sched.waiting)}")  # fmt: skip
    if riders:
        line += f", #mixed-decode: {len(riders)}"
    logger.info(line)


class DecodeLog:
    def __init__(self, interval: int):
        self.interval = interval
        self.steps = 0
        self._t: float | None = None  # start of the window: the last line, or the first decode step after idle
        self._tokens = 0  # the scheduler's generated-token count at the window's start
        self.last_gen_throughput = 0.0

    def after_decode_step(self, sched) -> None:
        if self._t is None:  # the first decode step since start-up or idle opens the window
            self._t, self._tokens = time.perf_counter(), sched.num_generated_tokens
            take_waited()
        self.steps += 1
        if self.steps % self.interval:
            return
        now = time.perf_counter()
        tokens = sched.num_generated_tokens
        window = max(now - self._t, 1e-9)
        self.last_gen_throughput = (tokens - self._tokens) / window
        self._t, self._tokens = now, tokens
        waited = take_waited()
        used, usage = _usage(sched)
        line = (f"Decode batch. #running-req: {len(sched.running)}, #token: {used}, "
                f"token usage: {usage:.2f}, "
                f"gen throughput (token/s): {self.last_gen_throughput:.2f}, #queue-req: {len(sched.waiting)}")  # fmt: skip
        if sched.spec is not None:
            line += f", accept len: {sched.spec.stats().get('avg_spec_accept_length', 0.0):.2f}"
        if sched.runner.device.type == "cuda":
            line += f", device wait: {waited / window:.2f}"
        logger.info(line)

    def idle(self) -> None:
        """The scheduler waits for requests: the next window starts at the next decode step."""
        self._t = None
