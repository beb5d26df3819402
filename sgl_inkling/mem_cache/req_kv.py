"""Per-request KV bookkeeping over the pools and the radix cache.

Positions [0, req.owned) of a request's table rows belong to the radix tree (locked while the
request runs); the request owns [owned, kv_len) and frees only those.
"""

from __future__ import annotations

import torch

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.mem_cache.radix_cache import RadixCache
from sgl_inkling.mem_cache.sconv_checkpoints import SConvCheckpointPool
from sgl_inkling.model_executor.model_runner import ModelRunner

# Most slots an eviction frees beyond what was asked for (see ensure): 32 decode steps at batch 128.
EVICT_AHEAD = 4096


def evict_ahead(pool_slots: int) -> int:
    """Slots an eviction frees beyond the asked-for ones: 1/64 of the pool, at most EVICT_AHEAD."""
    return min(EVICT_AHEAD, pool_slots // 64)


class ReqKVManager:
    def __init__(
        self,
        runner: ModelRunner,
        window: int,
        enable_cache: bool,
        num_checkpoints: int,
        interval: int,
    ):
        self.runner = runner
        self.window = window
        self.interval = interval  # a conv checkpoint every this many prompt tokens (0: none)
        self.full = runner.full_pool.allocator
        self.swa = runner.swa_pool.allocator
        self.rows = runner.req_to_token
        self.radix: RadixCache | None = None
        self._arrivals = 0
        # Prefix-cache accounting over first admissions (a retracted request is not counted again).
        self.counters = dict.fromkeys(
            (
                "radix_requests",
                "radix_hit_requests",
                "radix_hit_tokens",  # tokens served from the cache (sum of cached_tokens)
                "radix_matched_tokens",  # longest cached prefix, capped at what a request could reuse
                "radix_recomputed_tokens",  # matched but recomputed: no checkpoint was at hand there
                "radix_snapshots_skipped",  # snapshot points left out because no checkpoint slot was free
                "radix_end_checkpoints_missing",  # inserts cut back because the end checkpoint had no slot
            ),
            0,
        )
        if enable_cache:
            ckpts = SConvCheckpointPool(num_checkpoints, runner.sconv_pool, runner.dtype)
            self.radix = RadixCache(self.full, self.swa, ckpts, window)

    # ---------------------------------------------------------------- admission

    def on_arrival(self, req: Req) -> None:
        """Number the request and mark the cached prefix it will reuse, so eviction spares it."""
        self._arrivals += 1
        req.wait_seq = self._arrivals
        if self.radix is not None:
            self.radix.mark_wanted(req.cache_key, req)

    def admit(self, req: Req) -> bool:
        """Give the request a table row and resume it from the longest usable cached prefix."""
        row = self.rows.alloc()
        if row is None:
            return False
        req.row, req.kv_len, req.owned, req.swa_released, req.divergence = row, 0, 0, 0, None
        matched = 0
        if self.radix is not None:
            # Prompt logprobs need logits from logprob_start_len on: resume no later than that.
            key = req.cache_key
            key = key[: max(1, req.logprob_start_len)] if req.wants_input_logprobs else key
            req.resume_point = len(key) - 1  # where a repeat of this request will resume
            m = self.radix.match(key)
            c = m.resume_len
            if c > 0:
                lo = max(0, c - self.window + 1)
                swa = m.swa.clone()
                swa[:lo] = 0  # only the window before c is read
                self.rows.write("full", row, 0, m.full)
                self.rows.write("swa", row, 0, swa)
                self.radix.ckpts.restore(m.ckpt, row)
            self.radix.lock(m.node)
            req.last_node, req.kv_len, req.owned, req.swa_released = m.node, c, c, c
            if m.matched_len > c:
                req.divergence = m.matched_len
            matched = min(m.matched_len, len(key) - 1)
        if not req.admitted_once:
            req.cached_tokens = req.kv_len
            req.admitted_once = True
            if self.radix is not None:
                ct = self.counters
                ct["radix_requests"] += 1
                ct["radix_hit_requests"] += req.kv_len > 0
                ct["radix_hit_tokens"] += req.kv_len
                ct["radix_matched_tokens"] += matched
                ct["radix_recomputed_tokens"] += matched - req.kv_len
        return True

    def snapshot_plan(self, req: Req, n: int) -> list[tuple[int, int]]:
        """Checkpoint slots for the positions inside the next chunk that deserve one:
        - every `interval` tokens (a later divergence then recomputes less than one interval);
        - one before the chunk's end (whose own checkpoint cache_prefix takes): a prompt ending
          there (a repeat, a strict prefix ending on this boundary) resumes at its len - 1;
        - where a repeat of this request resumes (len - 1, or before the logprob start);
        - the divergence point found at admission and the position before it (later requests
          resume exactly there, or at len - 1 when the prompt ends on it)."""
        if self.radix is None:
            return []
        start, end = req.kv_len, req.kv_len + n
        points = {end - 1, req.resume_point}
        if self.interval > 0:
            points.update(range((start // self.interval + 1) * self.interval, end, self.interval))
        if req.divergence is not None:
            points.update((req.divergence - 1, req.divergence))
        points = sorted(p for p in points if start < p < end)
        self.radix.evict(ckpts=len(points))
        plan = []
        for p in points:
            slot = self.radix.ckpts.take()
            if slot is None:
                self.counters["radix_snapshots_skipped"] += 1
                continue
            plan.append((p - start, slot))
            req.pending_ckpts[p] = slot
        return plan

    # ---------------------------------------------------------------- allocation

    def ensure(self, n_full: int, n_swa: int) -> bool:
        if self.full.available >= n_full and self.swa.available >= n_swa:
            return True
        if self.radix is not None:
            # An eviction walks the whole tree (14 ms with 5K nodes and 60 running 8K prompts on a
            # CPU), so it frees a little ahead: a decode step at the pool's limit then evicts once
            # every few dozen steps instead of every step.
            self.radix.evict(full=n_full + evict_ahead(self.full.num_slots),
                             swa=n_swa + evict_ahead(self.swa.num_slots))  # fmt: skip
        return self.full.available >= n_full and self.swa.available >= n_swa

    def alloc(self, req: Req, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Slots for positions [kv_len, kv_len + n), recorded in the request's table rows."""
        if not self.ensure(n, n):
            return None
        full, swa = self.full.alloc(n), self.swa.alloc(n)
        self.rows.write("full", req.row, req.kv_len, full)
        self.rows.write("swa", req.row, req.kv_len, swa)
        return full, swa

    def alloc_each(self, reqs: list[Req]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One slot per request at its kv_len (a decode step): full and sliding slots [len(reqs)],
        recorded in both tables with one staged write for the whole batch."""
        n = len(reqs)
        if not self.ensure(n, n):
            return None
        full, swa = self.full.alloc(n), self.swa.alloc(n)
        rows = torch.tensor([r.row for r in reqs], dtype=torch.int64)
        positions = torch.tensor([r.kv_len for r in reqs], dtype=torch.int64)
        self.rows.write_points(rows, positions, {"full": full, "swa": swa})
        return full, swa

    def reserve(self, req: Req, n: int) -> bool:
        """Hold slots for tokens [kv_len, kv_len + n) (MTP: the tokens the next verify consumes),
        keeping those already held."""
        extra = n - req.kv_reserved
        if extra <= 0:
            return True
        if not self.ensure(extra, extra):
            return False
        at = req.kv_len + req.kv_reserved
        self.rows.write("full", req.row, at, self.full.alloc(extra))
        self.rows.write("swa", req.row, at, self.swa.alloc(extra))
        req.kv_reserved = n
        return True

    def release_window(self, req: Req) -> None:
        """Free the request's own sliding KV that no future query can see (older than the window)."""
        self.release_windows([req])

    def release_windows(self, reqs: list[Req]) -> None:
        """release_window for a batch: one free and one table write for all of them (a decode step
        slides every request's window by one slot)."""
        spans = []  # (row, lo, hi): positions [lo, hi) of the row go
        for req in reqs:
            lo = max(req.swa_released, req.owned)
            # MTP depths that lag (speculative/lagging.py) have yet to attend from depth_lag tokens back.
            hi = max(0, req.kv_len - req.depth_lag - self.window + 1)
            if hi > lo:
                spans.append((req.row, lo, hi))
            req.swa_released = max(req.swa_released, hi)
        if spans:
            # Every span's positions at once (a prefill chunk's span is thousands long, a decode
            # step's spans one each): rows repeated by span length, positions lo.. per span.
            row, lo, hi = torch.tensor(spans, dtype=torch.int64).unbind(1)
            counts = hi - lo
            rows_t = row.repeat_interleave(counts)
            positions_t = torch.arange(int(counts.sum())) + (lo - (counts.cumsum(0) - counts)).repeat_interleave(counts)
            self.swa.free(self.rows.read_points("swa", rows_t, positions_t))
            self.rows.write_points(rows_t, positions_t, {"swa": torch.zeros_like(rows_t)})

    # ---------------------------------------------------------------- prefix cache

    def after_extend(self, req: Req) -> None:
        if self.radix is None:
            self.release_window(req)
        else:
            self.cache_prefix(req)  # every chunk end is a checkpoint others can resume from

    def cache_prefix(self, req: Req) -> None:
        """Hand [0, kv_len) to the radix tree with conv checkpoints at kv_len and at the snapshots
        taken during the chunk; keep it locked. Sliding KV is kept only before checkpoints.

        KV is never cached past its last checkpoint: when no slot can be found for the end
        checkpoint (every one is held), the tree takes the prefix up to the deepest snapshot and
        the rest stays the request's, freed with it."""
        if self.radix is None or req.row is None or req.kv_len == 0:
            return
        self.radix.evict(ckpts=1)
        end_ckpt = self.radix.ckpts.save(req.row)
        n = req.kv_len
        if end_ckpt is None:
            self.counters["radix_end_checkpoints_missing"] += 1
            n = max([p for p in req.pending_ckpts if p <= n] + [req.owned])
            if n <= req.owned:
                self.release_window(req)
                return
            end_ckpt = req.pending_ckpts.pop(n)
        points = sorted(req.pending_ckpts) + [n]
        lo = max(req.owned, req.swa_released)
        if n > lo:
            keep = torch.zeros(n - lo, dtype=torch.bool)
            for p in points:
                keep[max(lo, p - self.window + 1) - lo : max(lo, p) - lo] = True
            seg = self.rows.read("swa", req.row, lo, n).clone()
            drop = ~keep & (seg != 0)
            if bool(drop.any()):
                self.swa.free(seg[drop])
                seg[drop] = 0
                self.rows.write("swa", req.row, lo, seg)
        tokens = req.cache_key[:n]
        full, swa = (
            self.rows.read("full", req.row, 0, n).clone(),
            self.rows.read("swa", req.row, 0, n).clone(),
        )
        # [0, owned) is the tree's already: its sliding slots there may have been freed since (below
        # the request's window, radix_eviction.py) while the table still names them, so offer none.
        swa[: req.owned] = 0
        node = self.radix.insert(tokens, full, swa, end_ckpt, dict(req.pending_ckpts))
        req.pending_ckpts.clear()
        # Duplicates of cached slots were freed: point the tables at the tree's copies.
        full, swa = self.radix.slots_of(node)
        self.rows.write("full", req.row, 0, full)
        self.rows.write("swa", req.row, 0, swa)
        self.radix.lock(node)
        self.radix.unlock(req.last_node)
        req.last_node, req.owned = node, n
        req.swa_released = max(req.swa_released, n)
        if n < req.kv_len:
            self.release_window(req)

    def free(self, req: Req) -> None:
        """Return the request's own slots and row, and unlock its cached prefix."""
        if req.row is None:
            return
        end = req.kv_len + req.kv_reserved
        self.full.free(self.rows.read("full", req.row, req.owned, end))
        swa = self.rows.read("swa", req.row, max(req.owned, req.swa_released), end)
        self.swa.free(swa[swa != 0])
        if self.radix is not None:
            if req.last_node is not None:
                self.radix.unlock(req.last_node)
            for slot in req.pending_ckpts.values():
                self.radix.ckpts.free(slot)
        req.pending_ckpts.clear()
        self.rows.free(req.row)
        req.row, req.kv_len, req.owned, req.swa_released, req.last_node = None, 0, 0, 0, None
        req.kv_reserved = 0

    def stats(self) -> dict[str, int]:
        out = {
            "full_kv_available": self.full.available,
            "full_kv_total": self.full.num_slots,
            "swa_kv_available": self.swa.available,
            "swa_kv_total": self.swa.num_slots,
            "req_slots_available": self.rows.available,
            "req_slots_total": self.rows.size,
        }
        if self.radix is not None:
            out.update(self.radix.stats())
            out.update(self.counters)
            out["sconv_checkpoint_interval"] = self.interval
            out["sliding_window_size"] = self.window
            out["full_kv_bytes_per_token"] = self.runner.full_pool.bytes_per_token()
            out["swa_kv_bytes_per_token"] = self.runner.swa_pool.bytes_per_token()
        return out
