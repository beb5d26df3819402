"""Triton attention backend: paged decode and extend kernels with Inkling's in-kernel relative bias.

Decode reads nothing from the host (grid and split count depend on shapes only), so a decode step
can be captured in a CUDA graph. Extend sizes its grid from the batch's host-side lengths; short
extensions (at most SHORT_EXTEND tokens per sequence, e.g. MTP's verify and draft steps) run as one
decode query per token instead, which spreads a long prefix over the SMs.
"""

from __future__ import annotations

import torch

from sgl_inkling.layers.attention.base import AttentionBackend, AttnLayerSpec
from sgl_inkling.mem_cache.memory_pool import KVPool, ReqToTokenPool
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling_kernels.decode_attention import (
    decode_attention,
    default_num_splits,
    extend_as_decode_queries,
)
from sgl_inkling_kernels.extend_attention import extend_attention

SHORT_EXTEND = 24


class TritonBackend(AttentionBackend):
    def __init__(self, req_to_token: ReqToTokenPool, full_pool: KVPool, swa_pool: KVPool | None):
        super().__init__(req_to_token, full_pool, swa_pool)
        device = full_pool.k[0].device if full_pool.k else torch.device("cpu")
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        self.block_n = 64 if device.type == "cuda" else 16
        self._q_start: torch.Tensor | None = None
        self._max_extend = 0
        self._as_decode: tuple[torch.Tensor, torch.Tensor] | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Extend: each sequence's first row in the flattened tokens and the longest extension, or
        for short extensions each token's row and position as a decode query."""
        self._as_decode = None  # before any return: a decode batch must not see an extend's queries
        if batch.mode is ForwardMode.DECODE:
            return
        self._max_extend = max(batch.extend_lens_cpu, default=0)
        if 0 < self._max_extend <= SHORT_EXTEND:
            self._as_decode = extend_as_decode_queries(
                batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, batch.input_ids.shape[0]
            )
            return
        self._q_start = torch.cumsum(batch.extend_lens, 0) - batch.extend_lens

    def forward(self, q, k, v, rel, rel_table, tau, spec: AttnLayerSpec, batch: ForwardBatch) -> torch.Tensor:
        pool, table = self.pool_of(spec, batch.table_offset)
        if k is not None:  # else the fused decode epilogue stored them
            pool.write(spec.layer_id, batch.out_loc_swa if spec.sliding else batch.out_loc, k, v)
        k_buf, v_buf = pool.buffers(spec.layer_id)
        if batch.mode is ForwardMode.DECODE or self._as_decode is not None:
            rows, positions = self._as_decode or (batch.req_pool_indices, batch.positions)
            max_keys = spec.window if spec.window is not None else table.shape[1]
            splits = default_num_splits(q.shape[0], spec.num_kv_heads, max_keys, self.block_n, self.num_sms)
            return decode_attention(
                q, k_buf, v_buf, table, rows, positions, rel, rel_table, tau,
                spec.scaling, spec.window, num_splits=splits, block_n=self.block_n,
            )  # fmt: skip
        return extend_attention(
            q, k_buf, v_buf, table, batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, rel,
            rel_table, tau, spec.scaling, spec.window, max_extend_len=self._max_extend, q_start=self._q_start,
        )  # fmt: skip
