"""Start-up measurement of what a speculative step costs, per batch bucket and number of drafts.

A step with k >= 1 drafts is the verify of k + 1 tokens per request, the trunk's rollback and the
draft step that produced the k drafts (k depths drafting, the rest consuming the kept tokens only).
With tails on (lagging.py) the draft step is the one where the depths past k skip, and the
catch-up of those depths is timed apart (StepCosts.tail_catch_up; the chooser counts its share).
A step with k = 0 is a plain decode step (the decode graph of the bucket) plus its share of the
depths' catch-up: after K + 1 plain steps in a row the depths consume those tokens in one
non-drafting draft step (lagging.py). On CUDA everything comes from the serving graphs just
captured, replayed on their padded inputs (the reserved row, the padding KV slot) with random token
ids, so the figures are what serving replays. The padded rows attend over a context of COST_CONTEXT
tokens whose keys and values are zero (_zero_context): with no context the verify's attention is
nearly free, and with the padding slot as context every row attends to the same written token, so
every row's hidden state, and with it the routing, is the same: a batch then reads six experts
instead of some two hundred, and the H200 NVFP4 slice timed a batch-64 decode step at 61% of the
same step in use, which made the chooser prefer plain decode. Zero values leave each row its own
embedding, so the routing spreads as real contexts spread it. Without graphs (benchmark smoke
runs) the same padded steps run eagerly, with no context.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable

import torch

from sgl_inkling.model_executor.cuda_graph_runner import bucket_for
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.speculative.adaptive import StepCosts
from sgl_inkling.speculative.draft_graphs import DraftGraphRunner
from sgl_inkling.speculative.verify_graphs import VerifyGraphRunner

EAGER_BUCKETS = (1,)
# Tokens of context the timed steps attend over: a typical chat or agent turn. Attention is a small
# share of a decode step at this length; what matters is that it is not zero.
COST_CONTEXT = 2048


def _seconds(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    """Median wall time of fn after one warm-up call."""
    cuda = device.type == "cuda"
    fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _random_ids(ids: torch.Tensor, vocab: int, seed: int = 0) -> None:
    """Random token ids in place. The graphs were captured on zeros, and identical tokens route to the
    same six experts, so a wide verify timed as cheap as a narrow one (H200, NVFP4 slice: 9 tokens x 8
    requests took 16 ms at start-up against 36 ms in use) and the chooser drafted the costliest k."""
    gen = torch.Generator(device=ids.device).manual_seed(seed)
    ids.copy_(torch.randint(0, vocab, ids.shape, generator=gen, device=ids.device))


def _at_context(statics: list[tuple[dict, int]], context: int, draft_start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Puts the padded rows of the timed steps `context` tokens into their sequence: decode and
    verify inputs ({"positions", "prefix_lens"}, `width` tokens per request); the draft step's
    ({"start"}) at draft_start; returns (tensor, saved copy) pairs for the caller to restore."""
    saved = []
    for s, width in statics:
        for f in ("positions", "prefix_lens", "start"):
            if f in s:
                saved.append((s[f], s[f].clone()))
        if "start" in s:
            s["start"].fill_(draft_start)
            continue
        s["prefix_lens"].fill_(context)
        cols = torch.arange(width, device=s["positions"].device) + context
        s["positions"].copy_(cols.repeat(s["positions"].numel() // width))
    return saved


@contextlib.contextmanager
def _zero_context(runner, upto: int):
    """The padding row's positions below `upto` read one slot of zero keys and values (one slot of
    each pool, taken from the allocators for the time being): attention does its work over them and
    adds nothing to the hidden state. Decode and verify rows write their tokens to slot 0 (their
    static out_loc), which nothing reads while this holds; the draft step writes through the table,
    at positions from `upto` on, which still map to slot 0."""
    table = runner.req_to_token
    pools = {"full": runner.full_pool, "swa": runner.swa_pool}
    slots = {kind: pool.allocator.alloc(1) for kind, pool in pools.items()}
    saved = {kind: getattr(table, kind)[table.pad_row].clone() for kind in pools}
    try:
        for kind, pool in pools.items():
            z = slots[kind].to(pool.k[0].device)
            for buf in pool.k + pool.v:
                buf[z] = 0
            getattr(table, kind)[table.pad_row, :upto] = z
        yield
    finally:
        for kind, pool in pools.items():
            getattr(table, kind)[table.pad_row] = saved[kind]
            pool.allocator.free(slots[kind])


def measure_step_costs(
    worker, reps: int = 5, trunk_scale: float = 1.0, head_s: float = 0.0, context: int = COST_CONTEXT,
    trunk_layers_s: dict[tuple[int, int], float] | None = None,
) -> StepCosts:
    """Seconds per step for k = 0..K at every bucket the worker's graphs cover (eager: EAGER_BUCKETS),
    the padded rows `context` tokens into their sequence (cut to what the request table holds).

    trunk_scale (benchmarks of a model cut to a few layers): a trunk forward (verify of r tokens a
    request, plain decode r = 1) at bucket bs counts as t + (trunk_scale - 1) * trunk_layers_s[bs, r]
    (its layers alone, measured by the benchmark), so the part outside the layers counts once; where
    that is missing, as (t - head_s) * trunk_scale + head_s (the LM head once at head_s). The MTP
    depths' draft steps count as measured."""
    layers_s = trunk_layers_s or {}

    def trunk(t: float, bs: int, r: int) -> float:
        if (bs, r) in layers_s:
            return t + (trunk_scale - 1) * layers_s[bs, r]
        return max(t - head_s, 0.0) * trunk_scale + head_s

    runner, k_max = worker.runner, worker.num_steps
    dev = runner.device
    if worker.verify_graphs:
        verify = worker.verify_graphs
        draft = worker.draft_graphs
        buckets = draft.buckets
        decode = runner.graphs
        timed_verify = {r: (lambda bs, g=g: g.graphs[bs].replay()) for r, g in verify.items()}
        timed_draft = lambda bs, k, tail: draft.graphs[bs, k, tail].replay()  # noqa: E731
        timed_tail = lambda bs, first: draft.catch_up_graphs[bs, first].replay()  # noqa: E731
        timed_restore = lambda bs: draft.restore_graphs[bs].replay()  # noqa: E731
        timed_plain = lambda bs: decode.graphs[bucket_for(decode.buckets, bs)].replay()  # noqa: E731
        statics = [g.static["input_ids"] for g in verify.values()] + [decode.static["input_ids"]]
        placed = [(g.static, g.r) for g in verify.values()] + [(decode.static, 1), (draft.static, 1)]
    else:
        buckets = list(EAGER_BUCKETS)
        max_bs = buckets[-1]
        eager_verify = {
            r: VerifyGraphRunner(runner, r, worker.trunk_capture, max_bs, graphs=False) for r in range(1, k_max + 2)
        }
        draft = DraftGraphRunner(worker.step, max_bs, depths=range(k_max + 1), capture=False, tails=worker.tail_lag)
        pad = runner.req_to_token.pad_row
        plain = {bs: ForwardBatch.build(ForwardMode.DECODE, [[0]] * bs, [pad] * bs, [0] * bs, [0] * bs, [0] * bs, dev)
                 for bs in buckets}  # fmt: skip
        timed_verify = {r: (lambda bs, g=g: g.step(bs)) for r, g in eager_verify.items()}
        timed_draft, timed_tail, timed_restore = draft.run, draft.run_catch_up, draft.restore
        timed_plain = lambda bs: runner.forward_eager(plain[bs])  # noqa: E731
        statics = [g.static["input_ids"] for g in eager_verify.values()] + [b.input_ids for b in plain.values()]
        placed = []  # eager smoke runs (CPU): the reference backend's loops read host lengths; no context
        reps = min(reps, 2)
    vocab = runner.model.cfg.unpadded_vocab_size
    for ids in statics:
        _random_ids(ids, vocab)
    # Decode and verify rows attend over [0, context + K]; the draft step starts past them (its tokens
    # are written through the table) and reaches 2K + 1 tokens further.
    context = max(worker.step.min_start(), min(context, runner.req_to_token.max_context_len - 3 * k_max - 3))
    draft_start = context + k_max + 1
    saved = _at_context(placed, context, draft_start)
    costs, tails = {}, {}
    # With tails (lagging.py) a step drafting k skips the depths past k, which catch up now and then.
    skips = {k for k, tail in draft.variants if tail < k_max} if worker.tail_lag else set()
    with torch.no_grad(), (_zero_context(runner, draft_start) if placed else contextlib.nullcontext()):
        for bs in buckets:
            catch_up = _seconds(lambda bs=bs: timed_draft(bs, 0, k_max), reps, dev)
            restore = _seconds(lambda bs=bs: timed_restore(bs), reps, dev)
            plain_step = trunk(_seconds(lambda bs=bs: timed_plain(bs), reps, dev), bs, 1) + catch_up / (k_max + 1)
            costs[bs] = [plain_step] + [
                trunk(_seconds(lambda bs=bs, k=k: timed_verify[k + 1](bs), reps, dev), bs, k + 1)
                + restore
                + _seconds(lambda bs=bs, k=k: timed_draft(bs, k, k if k in skips else k_max), reps, dev)
                for k in range(1, k_max + 1)
            ]
            tails[bs] = [_seconds(lambda bs=bs, k=k: timed_tail(bs, k), reps, dev) if k in skips else 0.0
                         for k in range(k_max + 1)]  # fmt: skip
    for ids in statics:
        ids.zero_()  # as captured: serving rewrites the real rows and zeroes the padding
    for t, old in saved:
        t.copy_(old)
    return StepCosts(costs, tail_catch_up=tails if skips else None, tail_capacity=worker.tail_capacity)
