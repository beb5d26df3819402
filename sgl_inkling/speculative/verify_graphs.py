"""MTP verify steps replayed from CUDA graphs, one per batch-size bucket.

A verify step is an extend of exactly K + 1 tokens per request with every row's logits and the
trunk's conv windows captured (for rollback), so its shapes depend on the bucket only. The greedy
acceptance rule runs in the same graph (from static draft limits and the benchmark's forced
counts). Plain-sampled batches (temperature > 0, no grammar mask, no penalties or seeds, top-k /
top-p boundaries among the TOPK_CANDIDATES most probable tokens) replay, right after that graph,
a small graph of the sampled rule alone (acceptance.sampled_accept on the trunk graph's static
logits and static per-request sampling tensors), in two forms: without and with the top-k / top-p
thresholds (a temperature-only batch skips the candidates' topk). A rule graph chained after the
trunk's rather than a second trunk graph or one graph whose rule a static flag picks: the trunk is
captured once (capture time, and no second copy of its [K + 1 x vocabulary] output logits kept
alive per bucket), the greedy rule never pays for the sampled one's float32 temporaries, and the
price is one more graph launch (microseconds) plus the greedy argmax the sampled batch ignores.
Grammar-masked batches, and sampled batches above sampled_graph_max_bs, judge the graph's logits
outside it. Padded requests use the runner's reserved row with no prefix and the padding KV slot
0, as in decode, and neutral sampling parameters (greedy).
The graphs share one memory pool (captured largest first): a verify's outputs are consumed before
the next verify replays, and [K + 1 tokens x vocabulary] logits per request make separate pools
too costly next to the weights. Adaptive drafting keeps one runner per verify width, all in one
pool. With graphs=False nothing is captured: `step` runs the padded batch eagerly (start-up cost
measurement on CPU) and `replay` runs the same rules eagerly on the static buffers (tests).
"""

from __future__ import annotations

import torch

from sgl_inkling.model_executor.cuda_graph_runner import bucket_for, capture_graph, graph_buckets
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.models.inkling.model import ModelOutput
from sgl_inkling.sampling.sampler import TOPK_CANDIDATES
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo
from sgl_inkling.speculative import acceptance
from sgl_inkling.speculative.acceptance import Accepted, RowParams, greedy_accept

_PER_TOKEN = ("input_ids", "positions", "out_loc", "out_loc_swa")
_PER_REQ = ("req_pool_indices", "prefix_lens")
_ACCEPT = ("limits", "forced")  # per request: most drafts it may accept; forced count or -1
# Per request, for the sampled rule: (dtype, neutral value for padded rows; top_ks': the vocabulary).
_SAMPLING = {"temperatures": (torch.float32, 1.0), "top_ks": (torch.int64, None), "top_ps": (torch.float32, 1.0),
             "min_ps": (torch.float32, 0.0), "is_greedy": (torch.bool, True)}  # fmt: skip
assert tuple(_SAMPLING) == RowParams.FIELDS


# Share of the device memory free at capture time (every pool already allocated) that the verify
# graphs' logits may take; the rest: the draft graphs, activations, and what serving allocates later.
LOGITS_MEMORY_SHARE = 0.5
# The sampled rule's peak per logit: the trunk graph's float32 logits, the rule's probabilities and
# its noise (acceptance.sampled_accept), alive together.
SAMPLED_BYTES_PER_LOGIT = 4 + 4 + 4


def kept_logits_bytes(runner, widths, max_bs: int) -> int:
    """Bytes of logits the verify graphs keep alive with buckets up to max_bs: every (width,
    bucket) graph holds its own outputs (bucket x width x padded vocabulary in float32, as the LM
    head returns them whatever the model's dtype) between replays, so they add up over widths and
    buckets; only the captures' temporaries share the pool. (Counted at the model's dtype, a bf16
    model was given twice the batches that fit: the bf16 MTP slice ran out of memory capturing.)"""
    return sum(graph_buckets(runner, max_bs)) * sum(widths) * runner.model.cfg.vocab_size * 4 if max_bs > 0 else 0


def graph_max_bs(runner, widths, free_bytes: int | None = None) -> int:
    """The largest speculative batch replayed from graphs (0: none): the decode graphs' largest
    bucket (--cuda-graph-max-bs), cut to the largest bucket whose verify graphs' kept logits over
    all `widths` (kept_logits_bytes), plus the widest verify's float32 logits as headroom for the
    captures' temporaries, fit LOGITS_MEMORY_SHARE of the free memory. Larger batches verify and
    draft eagerly."""
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(runner.device)[0]
    room, vocab = LOGITS_MEMORY_SHARE * free_bytes, runner.model.cfg.vocab_size
    best = 0
    for bs in runner.graphs.buckets:
        if kept_logits_bytes(runner, widths, bs) + bs * max(widths) * vocab * 4 > room:
            break
        best = bs
    return best


def sampled_graph_max_bs(runner, widths, max_bs: int, free_bytes: int | None = None) -> int:
    """The largest batch whose sampled verify replays from a graph (0: none): at most max_bs
    (graph_max_bs), and the sampled rule's temporaries, widest verify x vocabulary x
    SAMPLED_BYTES_PER_LOGIT per request (9 x 201K x 12 B = 21.7 MB for MTP8 on Inkling), must fit
    the logits' share of the free memory beside what the greedy graphs keep. Larger sampled
    batches replay the greedy graph and are judged outside it, as before."""
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(runner.device)[0]
    room = LOGITS_MEMORY_SHARE * free_bytes - kept_logits_bytes(runner, widths, max_bs)
    per_req = max(widths) * runner.model.cfg.vocab_size * SAMPLED_BYTES_PER_LOGIT
    return max(0, min(max_bs, int(room // per_req)))


class VerifyGraphRunner:
    def __init__(self, runner, tokens_per_req: int, capture: dict, max_bs: int, pool=None, graphs: bool = True,
                 sampled_max_bs: int = 0):  # fmt: skip
        self.runner = runner
        self.r = tokens_per_req
        self.capture = capture
        self.buckets = graph_buckets(runner, max_bs)
        self.pad_row = runner.req_to_token.pad_row
        n, dev = self.buckets[-1], runner.device
        self.vocab = runner.model.cfg.unpadded_vocab_size  # the logits' width
        self.static = {f: torch.zeros(n * self.r, dtype=torch.int64, device=dev) for f in _PER_TOKEN}
        self.static.update({f: torch.zeros(n, dtype=torch.int64, device=dev) for f in _PER_REQ + _ACCEPT})
        self.static.update({f: torch.zeros(n, dtype=dt, device=dev) for f, (dt, _) in _SAMPLING.items()})
        self.static["req_pool_indices"].fill_(self.pad_row)
        self._neutral(0, n)
        # The sampled rule's filter widths (acceptance.filter_width): none, or the topk candidates.
        self.filter_widths = (0, min(TOPK_CANDIDATES, self.vocab))
        self.sampled_buckets = [b for b in self.buckets if b <= sampled_max_bs]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # greedy rule, per bucket
        self.outputs: dict[int, tuple[ModelOutput, Accepted]] = {}
        self.sampled: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Accepted]] = {}  # (width, bucket)
        self.batches: dict[int, ForwardBatch] = {}
        self.captured = graphs
        if not graphs:
            return
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            self._capture(bs)
        for bs in reversed(self.sampled_buckets):
            for width in self.filter_widths:
                self.sampled[width, bs] = capture_graph(lambda bs=bs, w=width: self._sampled_rule(bs, w), self.pool)

    def _neutral(self, lo: int, hi: int) -> None:
        """Padded requests sample nothing: greedy, temperature 1, no filters."""
        for f, (_, value) in _SAMPLING.items():
            self.static[f][lo:hi] = self.vocab if value is None else value

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

    def step(self, bs: int, batch: ForwardBatch | None = None, width: int | None = None) -> tuple[ModelOutput, Accepted]:
        """The verify and the greedy decisions on the static inputs of bucket bs; with width (eager
        only) the sampled rule's decisions instead."""
        s = self.static
        batch = batch if batch is not None else self._batch(bs)
        out = self.runner.forward_eager(batch)
        ids = s["input_ids"][: bs * self.r].view(bs, self.r)
        logits = out.logits.view(bs, self.r, -1)
        if width is None:
            return out, greedy_accept(logits, ids, s["limits"][:bs], s["forced"][:bs])
        return out, self._sampled_rule(bs, width, out)

    def _sampled_rule(self, bs: int, width: int, out: ModelOutput | None = None) -> Accepted:
        """The sampled rule on bucket bs's static inputs and the trunk's logits (captured: the
        trunk graph's outputs). Inside a graph its draws come from the default CUDA generator,
        which CUDA graphs keep fresh: capture records the philox offset increments of the graphed
        region, and every replay advances the generator's offset by that total before launching,
        so each replay draws new numbers (a private torch.Generator would have to be registered
        with the graph; the default one needs nothing) and eager draws after it never repeat them."""
        s = self.static
        out = out if out is not None else self.outputs[bs][0]
        ids = s["input_ids"][: bs * self.r].view(bs, self.r)
        rows = RowParams(*(s[f][:bs] for f in RowParams.FIELDS))
        return acceptance.sampled_accept(out.logits.view(bs, self.r, -1), ids, rows, s["limits"][:bs], width)

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

    def can_sample(self, bs: int, width: int) -> bool:
        """A sampled batch of bs requests with this filter width has a sampled graph."""
        return width in self.filter_widths and bool(self.sampled_buckets) and bs <= self.sampled_buckets[-1]

    def sampling_inputs(self, params: list, excluded: bool) -> tuple[RowParams, int] | None:
        """The sampled rule's per-request tensors and filter width when this runner's graphs judge a
        batch with these SamplingParams, else None: plain-sampled (some temperature > 0; no penalty
        or seed, and not `excluded`: a grammar or forced counts), a sampled graph covering its size
        and filters. One host-to-device copy per field, no read back."""
        if excluded or all(p.is_greedy for p in params):
            return None
        if any(p.needs_penalties or p.seed is not None for p in params):
            return None
        width = acceptance.filter_width(params, self.vocab)
        if not self.can_sample(len(params), width):
            return None
        return RowParams.of(SamplingBatchInfo.from_params(params, self.vocab, self.runner.device)), width

    def replay(self, batch: ForwardBatch, limits: torch.Tensor, forced: torch.Tensor, rows: RowParams | None = None,
               width: int = 0) -> tuple[ModelOutput, Accepted]:  # fmt: skip
        """The trunk's outputs and the decisions (limits, forced, rows: [B] on the device): the
        greedy rule, or with rows (and can_sample) the sampled rule."""
        bs = batch.batch_size
        bucket = bucket_for(self.buckets if rows is None else self.sampled_buckets, bs)
        s, t, end = self.static, bs * self.r, bucket * self.r
        for f in _PER_TOKEN:
            s[f][:t].copy_(getattr(batch, f))
        for f in _PER_REQ:
            s[f][:bs].copy_(getattr(batch, f))
        s["limits"][:bs].copy_(limits)
        s["forced"][:bs].copy_(forced)
        if rows is not None:
            for f in RowParams.FIELDS:
                s[f][:bs].copy_(getattr(rows, f))
        if bucket > bs:  # padded requests: the reserved row, no prefix, the padding slot
            for f in _PER_TOKEN:
                s[f][t:end] = 0
            s["positions"][t:end] = torch.arange(self.r, device=s["positions"].device).repeat(bucket - bs)
            s["prefix_lens"][bs:bucket] = 0
            s["req_pool_indices"][bs:bucket] = self.pad_row
            if rows is not None:
                self._neutral(bs, bucket)
        width_key = None if rows is None else width
        if not self.captured:  # eager, on the static buffers (the reference backend reads host lengths)
            padded = self._batch(bucket)
            padded.prefix_lens_cpu = list(batch.prefix_lens_cpu) + [0] * (bucket - bs)
            padded.req_pool_indices_cpu = list(batch.rows_cpu()) + [self.pad_row] * (bucket - bs)
            out, acc = self.step(bucket, padded, width_key)
        elif rows is None:
            self.graphs[bucket].replay()
            out, acc = self.outputs[bucket]
        else:
            self.graphs[bucket].replay()
            out = self.outputs[bucket][0]
            graph, acc = self.sampled[width, bucket]
            graph.replay()  # after the trunk's, on its logits
        return ModelOutput(logits=out.logits[:t], hidden=out.hidden[:t]), Accepted(acc.lengths[:bs], acc.tokens[:bs])
