"""MTP verify steps replayed from CUDA graphs, one per batch-size bucket.

A verify step is an extend of exactly K + 1 tokens per request with every row's logits and the
trunk's conv windows captured (for rollback), so its shapes depend on the bucket only. The greedy
acceptance rule runs in the same graph (from static draft limits and the benchmark's forced
counts); sampled or grammar-masked batches judge the graph's logits outside it. Padded
requests use the runner's reserved row with no prefix and the padding KV slot 0, as in decode.
The graphs share one memory pool (captured largest first): a verify's outputs are consumed before
the next verify replays, and [K + 1 tokens x vocabulary] logits per request make separate pools
too costly next to the weights. Adaptive drafting keeps one runner per verify width, all in one
pool. With capture=False nothing is captured: `step` runs the padded batch eagerly (start-up cost
measurement on CPU).
"""

from __future__ import annotations

import torch

from sgl_inkling.model_executor.cuda_graph_runner import bucket_for, buckets_up_to, capture_graph
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.models.inkling.model import ModelOutput
from sgl_inkling.speculative.acceptance import Accepted, greedy_accept

_PER_TOKEN = ("input_ids", "positions", "out_loc", "out_loc_swa")
_PER_REQ = ("req_pool_indices", "prefix_lens")
_ACCEPT = ("limits", "forced")  # per request: most drafts it may accept; forced count or -1


# Share of the device memory free at capture time that the widest verify's logits may take (the
# rest: the draft graphs, activations, and what serving allocates later).
LOGITS_MEMORY_SHARE = 0.5
KNOWN_GOOD_BS = 64  # captured on the H200 slice with its pools sized by default (one shared pool)


def graph_max_bs(runner, tokens_per_req: int, free_bytes: int | None = None) -> int:
    """The largest speculative batch replayed from graphs: the decode graphs' (--cuda-graph-max-bs),
    cut to what memory allows above KNOWN_GOOD_BS. The graphs share one pool whose size the largest
    bucket sets; its widest verify keeps tokens_per_req x vocabulary logits per request (bf16, plus
    an fp32 temporary of the same shape counted as headroom)."""
    cap = runner.graphs.buckets[-1]
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(runner.device)[0]
    per_req = tokens_per_req * runner.model.cfg.vocab_size * (2 + 4)
    fits = int(LOGITS_MEMORY_SHARE * free_bytes) // per_req
    return min(cap, max(KNOWN_GOOD_BS, fits))


class VerifyGraphRunner:
    def __init__(self, runner, tokens_per_req: int, capture: dict, max_bs: int, pool=None, graphs: bool = True):
        self.runner = runner
        self.r = tokens_per_req
        self.capture = capture
        self.buckets = buckets_up_to(max_bs)
        self.pad_row = runner.req_to_token.pad_row
        n, dev = self.buckets[-1], runner.device
        self.static = {f: torch.zeros(n * self.r, dtype=torch.int64, device=dev) for f in _PER_TOKEN}
        self.static.update({f: torch.zeros(n, dtype=torch.int64, device=dev) for f in _PER_REQ + _ACCEPT})
        self.static["req_pool_indices"].fill_(self.pad_row)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[ModelOutput, Accepted]] = {}
        self.batches: dict[int, ForwardBatch] = {}
        if not graphs:
            return
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            self._capture(bs)

    def _batch(self, bs: int) -> ForwardBatch:
        s, t, dev = self.static, bs * self.r, self.runner.device
        batch = ForwardBatch(
            mode=ForwardMode.EXTEND,
            input_ids=s["input_ids"][:t],
            positions=s["positions"][:t],
            req_pool_indices=s["req_pool_indices"][:bs],
            prefix_lens=s["prefix_lens"][:bs],
            extend_lens=torch.full((bs,), self.r, dtype=torch.int64, device=dev),
            out_loc=s["out_loc"][:t],
            out_loc_swa=s["out_loc_swa"][:t],
            logits_indices=torch.arange(t, device=dev),
            prefix_lens_cpu=[1] * bs,  # host copies feed only the reference backend's loops
            extend_lens_cpu=[self.r] * bs,
        )
        batch.sconv_capture = self.capture
        return batch

    def step(self, bs: int, batch: ForwardBatch | None = None) -> tuple[ModelOutput, Accepted]:
        """The verify and the greedy decisions on the static inputs of bucket bs."""
        s = self.static
        batch = batch if batch is not None else self._batch(bs)
        out = self.runner.forward_eager(batch)
        ids = s["input_ids"][: bs * self.r].view(bs, self.r)
        logits = out.logits.view(bs, self.r, -1)
        return out, greedy_accept(logits, ids, s["limits"][:bs], s["forced"][:bs])

    def _capture(self, bs: int) -> None:
        batch = self._batch(bs)
        graph, out = capture_graph(lambda: self.step(bs, batch), self.pool)
        self.graphs[bs], self.outputs[bs], self.batches[bs] = graph, out, batch

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.batch_size <= self.buckets[-1]
            and all(n == self.r for n in batch.extend_lens_cpu)
            and batch.input_embeds is None
            and not batch.sconv_snapshots
        )

    def replay(self, batch: ForwardBatch, limits: torch.Tensor, forced: torch.Tensor) -> tuple[ModelOutput, Accepted]:
        """The trunk's outputs and the greedy decisions (limits, forced: [B] on the device)."""
        bs = batch.batch_size
        bucket = bucket_for(self.buckets, bs)
        s, t, end = self.static, bs * self.r, bucket * self.r
        for f in _PER_TOKEN:
            s[f][:t].copy_(getattr(batch, f))
        for f in _PER_REQ:
            s[f][:bs].copy_(getattr(batch, f))
        s["limits"][:bs].copy_(limits)
        s["forced"][:bs].copy_(forced)
        if bucket > bs:  # padded requests: the reserved row, no prefix, the padding slot
            for f in _PER_TOKEN:
                s[f][t:end] = 0
            s["positions"][t:end] = torch.arange(self.r, device=s["positions"].device).repeat(bucket - bs)
            s["prefix_lens"][bs:bucket] = 0
            s["req_pool_indices"][bs:bucket] = self.pad_row
        self.graphs[bucket].replay()
        out, acc = self.outputs[bucket]
        return ModelOutput(logits=out.logits[:t], hidden=out.hidden[:t]), Accepted(acc.lengths[:bs], acc.tokens[:bs])
