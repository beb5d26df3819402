"""Triton attention backend: paged decode and extend kernels with Inkling's in-kernel relative bias.

Decode reads nothing from the host (grid and split count depend on shapes only), so a decode step
can be captured in a CUDA graph. Extend sizes its grid from the batch's host-side lengths; short
extensions (at most SHORT_EXTEND tokens per sequence, e.g. MTP's verify and draft steps) run as one
decode query per token instead, which spreads a long prefix over the SMs. A batch of both (a mixed
step: prefill chunks with one decode token per running request) runs each part its own way: in the
extend kernel a rider's one query took a whole program per KV head walking its prefix alone, 0.34-0.38 ms
a rider 8.7K deep on the H200 at 1fc17cb against 0.16 ms a token in a batch-64 decode step.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from sgl_inkling.layers.attention.base import AttentionBackend, AttnLayerSpec
from sgl_inkling.mem_cache.memory_pool import KVPool, ReqToTokenPool
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.sampling.host_copy import to_device
from sgl_inkling_kernels.decode_attention import (
    decode_attention,
    default_num_splits,
    extend_as_decode_queries,
)
from sgl_inkling_kernels.extend_attention import extend_attention

SHORT_EXTEND = 24


def _common(lens: list[int]) -> int | None:
    """The one length every sequence brings (MTP verify and draft batches, decode riders), else None:
    their decode queries then come from a broadcast rather than scans."""
    return lens[0] if lens and all(n == lens[0] for n in lens) else None


class TritonBackend(AttentionBackend):
    def __init__(self, req_to_token: ReqToTokenPool, full_pool: KVPool, swa_pool: KVPool | None):
        super().__init__(req_to_token, full_pool, swa_pool)
        device = full_pool.k[0].device if full_pool.k else torch.device("cpu")
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        self.block_n = 64 if device.type == "cuda" else 16
        self._q_start: torch.Tensor | None = None
        self._max_extend = 0
        self._as_decode: tuple[torch.Tensor, torch.Tensor] | None = None
        self._long: tuple[torch.Tensor, ...] | None = None  # a mixed batch's long sequences (below)
        self._short_tokens: torch.Tensor | None = None  # and its short ones' token rows

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Extend: each sequence's first row in the flattened tokens and the longest extension, or
        for short extensions each token's row and position as a decode query; a batch of both gets
        the long sequences' extend arguments and the short ones' decode queries."""
        self._as_decode = self._long = self._short_tokens = None  # a decode batch must not see an extend's
        if batch.mode is ForwardMode.DECODE:
            return
        lens = batch.extend_lens_cpu
        self._max_extend = max(lens, default=0)
        if 0 < self._max_extend <= SHORT_EXTEND:
            self._as_decode = extend_as_decode_queries(
                batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, batch.input_ids.shape[0],
                width=_common(lens),
            )
            return
        self._q_start = batch.extend_starts()
        short = [i for i, n in enumerate(lens) if 0 < n <= SHORT_EXTEND]
        if not short:
            return
        long = [i for i, n in enumerate(lens) if n > SHORT_EXTEND]
        starts = list(accumulate(lens, initial=0))  # each sequence's first row in the flattened tokens
        dev = batch.extend_lens.device
        tokens = [starts[i] + j for i in short for j in range(lens[i])]
        # Host lists, one staged copy each (no device sync); the rest are device gathers.
        at_long, at_short, self._short_tokens = (to_device(x, torch.int64, dev) for x in (long, short, tokens))
        pick = (batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, self._q_start)
        self._long = tuple(t.index_select(0, at_long) for t in pick)
        sub = [t.index_select(0, at_short) for t in pick[:3]]
        self._as_decode = extend_as_decode_queries(*sub, len(tokens), width=_common([lens[i] for i in short]))

    def forward(self, q, k, v, rel, rel_table, tau, spec: AttnLayerSpec, batch: ForwardBatch) -> torch.Tensor:
        pool, table = self.pool_of(spec, batch.table_offset)
        if k is not None:  # else the fused decode epilogue stored them
            pool.write(spec.layer_id, batch.out_loc_swa if spec.sliding else batch.out_loc, k, v)
        k_buf, v_buf = pool.buffers(spec.layer_id)
        if batch.mode is ForwardMode.DECODE:
            return self._decode(
                q, k_buf, v_buf, table, batch.req_pool_indices, batch.positions, rel, rel_table, tau, spec, True
            )
        if self._long is None and self._as_decode is not None:
            return self._decode(q, k_buf, v_buf, table, *self._as_decode, rel, rel_table, tau, spec)
        rows, prefix_lens, extend_lens, q_start = self._long or (
            batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, self._q_start
        )
        out = extend_attention(
            q, k_buf, v_buf, table, rows, prefix_lens, extend_lens, rel, rel_table, tau, spec.scaling,
            spec.window, max_extend_len=self._max_extend, q_start=q_start,
        )  # fmt: skip
        if self._long is not None:  # the short sequences' rows, which the extend kernel left unwritten
            at = self._short_tokens
            out[at] = self._decode(
                q.index_select(0, at), k_buf, v_buf, table, *self._as_decode, rel.index_select(0, at), rel_table,
                tau.index_select(0, at) if tau is not None else None, spec,
            )  # fmt: skip
        return out

    def _decode(self, q, k_buf, v_buf, table, rows, positions, rel, rel_table, tau, spec: AttnLayerSpec, step=False):
        """step: a decode step, whose last kernel before this wrote only q and each sequence's new key and
        value (decode_attention's one_new_key); not the extend's tokens taken as decode queries."""
        max_keys = spec.window if spec.window is not None else table.shape[1]
        splits = default_num_splits(q.shape[0], spec.num_kv_heads, max_keys, self.block_n, self.num_sms)
        return decode_attention(
            q, k_buf, v_buf, table, rows, positions, rel, rel_table, tau,
            spec.scaling, spec.window, num_splits=splits, block_n=self.block_n, one_new_key=step,
        )  # fmt: skip
