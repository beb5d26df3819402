"""Per-request KV bookkeeping over the pools: allocate new tokens, free the sliding tail, free all."""

from __future__ import annotations

import torch

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.model_executor.model_runner import ModelRunner


class ReqKVManager:
    def __init__(self, runner: ModelRunner, window: int):
        self.runner = runner
        self.window = window
        self.full = runner.full_pool.allocator
        self.swa = runner.swa_pool.allocator
        self.rows = runner.req_to_token

    def can_alloc(self, n_full: int, n_swa: int) -> bool:
        return self.full.available >= n_full and self.swa.available >= n_swa

    def alloc(self, req: Req, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Slots for positions [kv_len, kv_len + n) of the request, recorded in its table rows."""
        if req.row is None:
            row = self.rows.alloc()
            if row is None:
                return None
            req.row = row
        if not self.can_alloc(n, n):
            return None
        full, swa = self.full.alloc(n), self.swa.alloc(n)
        dev = self.runner.device
        self.rows.full[req.row, req.kv_len : req.kv_len + n] = full.to(dev)
        self.rows.swa[req.row, req.kv_len : req.kv_len + n] = swa.to(dev)
        return full, swa

    def release_window(self, req: Req) -> None:
        """Free sliding-layer KV no future query of this request can see (older than the window)."""
        upto = max(0, req.kv_len - self.window + 1)
        if upto > req.swa_released:
            self.swa.free(self.rows.swa[req.row, req.swa_released : upto])
            req.swa_released = upto

    def free(self, req: Req) -> None:
        """Return every slot and the table row; the request can later be re-prefilled from scratch."""
        if req.row is None:
            return
        self.full.free(self.rows.full[req.row, : req.kv_len])
        self.swa.free(self.rows.swa[req.row, req.swa_released : req.kv_len])
        self.rows.free(req.row)
        req.row, req.kv_len, req.swa_released = None, 0, 0

    def stats(self) -> dict[str, int]:
        return {
            "full_kv_available": self.full.available,
            "full_kv_total": self.full.num_slots,
            "swa_kv_available": self.swa.available,
            "swa_kv_total": self.swa.num_slots,
            "req_slots_available": self.rows.available,
            "req_slots_total": self.rows.size,
        }
