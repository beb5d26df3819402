"""Order of admission for waiting requests: FCFS, or longest cached prefix first (SGLang's lpm)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.mem_cache.radix_cache import RadixCache

# lpm reorders only a long queue (a short one drains soon anyway) and never delays a request that
# has waited longer than this: it jumps ahead, so nobody starves behind a stream of cache hits.
LPM_MIN_QUEUE = 8
MAX_WAIT_S = 2.0


class SchedulePolicy:
    def __init__(self, name: str, radix: RadixCache | None):
        self.name = name if radix is not None else "fcfs"
        self.radix = radix

    def order(self, waiting: Iterable[Req]) -> list[Req]:
        reqs = list(waiting)
        if self.name != "lpm" or len(reqs) < LPM_MIN_QUEUE:
            return reqs
        now = time.monotonic()
        overdue = [r for r in reqs if now - r.arrival > MAX_WAIT_S]
        rest = [r for r in reqs if now - r.arrival <= MAX_WAIT_S]
        rest.sort(key=lambda r: -self.radix.peek(r.cache_key))  # stable: FCFS among equals
        return overdue + rest
