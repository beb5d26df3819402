"""Decode steps replayed from CUDA graphs captured once per batch-size bucket.

A decode batch is padded up to the next bucket: padded rows read and write only the padding KV slot
(0) and a request row reserved for them, so they cannot disturb real requests. Everything the
captured step reads lives in static buffers that are refilled before each replay; nothing inside
the graph syncs with the host (the triton attention backend and the fused kernels).

The scheduler's decode batches are staged straight into those buffers (`stage_decode`): one copy
from the host for every field and the padding rows, plus one device copy of input ids sampled on the
device, where a batch built elsewhere costs a copy per field at replay and a fill per field for the
padding (up to 12 small operations, each with its launch gap, beside the graph every step).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sgl_inkling.model_executor.forward_batch import INT64_PER_16_BYTES, ForwardBatch, ForwardMode
from sgl_inkling.models.inkling.model import ModelOutput
from sgl_inkling.sampling.host_copy import to_device

_BUCKETS = (
    1,
    2,
    4,
    8,
    12,
    16,
    24,
    32,
    40,
    48,
    56,
    64,
    80,
    96,
    112,
    128,
    160,
    192,
    224,
    256,
    320,
    384,
    448,
    512,
)


def buckets_up_to(max_bs: int) -> list[int]:
    """The batch sizes graphs are captured for: the standard buckets below max_bs, and max_bs."""
    return [b for b in _BUCKETS if b < max_bs] + [max_bs]


def graph_buckets(runner, max_bs: int) -> list[int]:
    """The batch sizes the speculative graphs capture up to max_bs: the decode graphs' own (standard,
    or --cuda-graph-bs), so a verify and a decode step of one batch pad alike; without decode graphs
    (eager cost tables, tests) the standard buckets."""
    graphs = getattr(runner, "graphs", None)
    if graphs is None:
        return buckets_up_to(max_bs)
    return [b for b in graphs.buckets if b < max_bs] + [max_bs]


def bucket_for(buckets: list[int], bs: int) -> int:
    """The smallest captured batch size that holds bs requests."""
    return buckets[bisect.bisect_left(buckets, bs)]


_FIELDS = ("input_ids", "positions", "req_pool_indices", "prefix_lens", "out_loc", "out_loc_swa")


def capture_graph(fn: Callable[[], Any], pool=None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Warm up `fn` (kernel compilation, autotuning) off the capture stream, then capture one call.
    Keep its inputs alive with the graph: the graph reads them by address."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def capture_forward(runner, batch: ForwardBatch, pool=None) -> tuple[torch.cuda.CUDAGraph, ModelOutput]:
    return capture_graph(lambda: runner.forward_eager(batch), pool)


class CudaGraphRunner:
    def __init__(self, runner, max_bs: int, capture: bool = True, buckets: Sequence[int] | None = None):
        """capture=False sets up the static inputs and batches alone (a CPU test of stage_decode);
        `buckets` (--cuda-graph-bs): the batch sizes to capture, in place of the standard ones up to max_bs."""
        self.runner = runner
        self.buckets = sorted(set(buckets)) if buckets else buckets_up_to(max_bs)
        self.pad_row = runner.req_to_token.pad_row  # never handed to a request; its table row is all 0
        n, dev = self.buckets[-1], runner.device
        # One [fields, n] block: stage_decode fills the first `bucket` columns of every field at once.
        # Rows padded to an even length, so every field starts 16-byte aligned as ForwardBatch.build's
        # do: with an odd largest bucket (--cuda-graph-max-bs 1) the positions and SWA slots were
        # 8-byte aligned, and the graphs ran kernel variants warm-up had not compiled.
        self.inputs = torch.zeros(len(_FIELDS), n + -n % INT64_PER_16_BYTES, dtype=torch.int64, device=dev)
        self.static = {f: self.inputs[i] for i, f in enumerate(_FIELDS)}
        self.static["req_pool_indices"].fill_(self.pad_row)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, ModelOutput] = {}
        self.batches = {bs: self._batch(bs) for bs in self.buckets}
        for bs in reversed(self.buckets) if capture else ():
            self._capture(bs)

    def _batch(self, bs: int) -> ForwardBatch:
        dev = self.runner.device
        return self._static_batch(bs, torch.ones(bs, dtype=torch.int64, device=dev), torch.arange(bs, device=dev),
                                  [0] * bs)  # fmt: skip

    def _static_batch(self, bs: int, extend_lens: torch.Tensor, logits_indices: torch.Tensor,
                      prefix_lens_cpu: list[int], rows_cpu: Sequence[int] = ()) -> ForwardBatch:  # fmt: skip
        """A decode batch of the first bs rows of the static inputs."""
        s = self.static
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=s["input_ids"][:bs],
            positions=s["positions"][:bs],
            req_pool_indices=s["req_pool_indices"][:bs],
            prefix_lens=s["prefix_lens"][:bs],
            extend_lens=extend_lens,
            out_loc=s["out_loc"][:bs],
            out_loc_swa=s["out_loc_swa"][:bs],
            logits_indices=logits_indices,
            prefix_lens_cpu=prefix_lens_cpu,
            extend_lens_cpu=[1] * bs,
            req_pool_indices_cpu=list(rows_cpu),
        )

    def _capture(self, bs: int) -> None:
        # Each graph keeps its own memory pool: buckets are replayed in any order, so one graph's
        # intermediates must never alias another's outputs.
        self.graphs[bs], self.outputs[bs] = capture_forward(self.runner, self.batches[bs])

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.mode is ForwardMode.DECODE
            and batch.batch_size <= self.buckets[-1]
            and batch.input_embeds is None
            and not batch.sconv_snapshots
        )

    def stage_decode(self, input_ids: torch.Tensor | list[list[int]], rows: list[int], prefix_lens: list[int],
                     out_loc: list[int], out_loc_swa: list[int]) -> ForwardBatch | None:  # fmt: skip
        """A decode batch (as ForwardBatch.build's) whose fields are the graphs' static inputs, written
        here with the padding up to its bucket; replay then copies nothing. Input ids come as host
        lists or as a [B, 1] device tensor (the pending step's samples). None when no graph holds it."""
        bs = len(rows)
        if not 0 < bs <= self.buckets[-1]:
            return None
        bucket = bucket_for(self.buckets, bs)
        pad = [0] * (bucket - bs)
        on_device = isinstance(input_ids, torch.Tensor)
        ids = [0] * bs if on_device else [x for (x,) in input_ids]  # placeholders: overwritten below
        # The order of _FIELDS; a decode token's position is its prefix length.
        host = [ids + pad, prefix_lens + pad, rows + [self.pad_row] * len(pad), prefix_lens + pad,
                out_loc + pad, out_loc_swa + pad]  # fmt: skip
        self.inputs[:, :bucket].copy_(to_device(host, torch.int64, self.inputs.device))
        if on_device:
            self.inputs[0, :bs].copy_(input_ids.view(-1))
        captured = self.batches[bucket]
        return self._static_batch(bs, captured.extend_lens[:bs], captured.logits_indices[:bs], list(prefix_lens), rows)

    def replay(self, batch: ForwardBatch) -> ModelOutput:
        bs = batch.batch_size
        bucket = bucket_for(self.buckets, bs)
        s = self.static
        if batch.positions.data_ptr() == s["positions"].data_ptr():  # staged (stage_decode): in place
            self.graphs[bucket].replay()
            out = self.outputs[bucket]
            return ModelOutput(logits=out.logits[:bs], hidden=out.hidden[:bs])
        for f in _FIELDS:
            s[f][:bs].copy_(getattr(batch, f))
        if bucket > bs:  # padded rows: the reserved row, position 0, the padding slot
            s["input_ids"][bs:bucket] = 0
            s["positions"][bs:bucket] = 0
            s["prefix_lens"][bs:bucket] = 0
            s["req_pool_indices"][bs:bucket] = self.pad_row
            s["out_loc"][bs:bucket] = 0
            s["out_loc_swa"][bs:bucket] = 0
        self.graphs[bucket].replay()
        out = self.outputs[bucket]
        return ModelOutput(logits=out.logits[:bs], hidden=out.hidden[:bs])
