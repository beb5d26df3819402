"""Order of admission for waiting requests: FCFS, or longest cached prefix first (SGLang's lpm).

What bounds a request's wait (scheduler_prefill.py applies the order):
- fcfs: arrival order. lpm: the same while fewer than LPM_MIN_QUEUE wait; a longer queue is sorted
  by cached prefix, except that every request waiting longer than MAX_WAIT_S goes first, in arrival
  order: no later arrival overtakes it after that, however well it hits the cache.
- Admission is head-of-line: when the request at the head does not fit (no table row, or not enough
  KV memory), nobody behind it is admitted, so a long prompt is never starved by a stream of short
  ones; partially prefilled requests continue before anyone new is admitted.
- Decode never starves prefill: without mixing, a step with waiting prompts prefills first; with
  --enable-mixed-chunk the running requests' decode tokens ride on the chunk but leave it at least
  half of --chunked-prefill-size (more running requests: the step prefills alone).
So a request waits at most for the prompts that arrived before it (or, under lpm, for MAX_WAIT_S of
cache-friendly reordering first) and for the memory that running requests give back.
"""

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
