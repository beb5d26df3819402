"""Start-up warm-up: run every Triton kernel variant serving can reach, so no request waits for a
JIT compile.

A kernel compiles once per set of constexprs and specialised int arguments. The constexprs come
from the model's shapes, plus a few choices made from the token count: extensions of at most
SHORT_EXTEND tokens per sequence run as decode queries, the router's fp32 GEMM runs in our kernel
up to FUSED_ROUTER_MAX_TOKENS, and the fused MoE takes large row blocks once a batch has
4 (token, expert) pairs per local expert. For the smallest batches (ALIGNED_ROUTER_MAX_TOKENS) the
router's launch also lays out the experts' pairs, a variant per block size of that layout (the batch's
size picks it: MoE.align_block_m). On a CUDA GPU, moe_align lays out more than SMALL_ALIGN_PAIRS pairs
(up to SORT_ALIGN_PAIRS) in one sorting program, compiled once for all: one batch past SMALL_ALIGN_PAIRS
pairs reaches it. With NVFP4 experts on a CUDA GPU, batches of up to
CUDA_MAX_PAIRS_PER_EXPERT pairs per expert take the CUDA decode kernels (one build of every
variant, at the first call), whose BF16 sinks are Triton GEMVs with one variant per token tile
(sink_gemv.WARMUP_TOKENS), and longer ones the Triton MMA kernels. The kernels mark their batch-dependent ints
`do_not_specialize` and ForwardBatch keeps each index tensor 16-byte aligned (Triton also keys on pointer
alignment), so one batch down each path is enough: extends of 1 token, SHORT_EXTEND, one
past it, one past the router limit, one past the MoE's and the first of each block size of the
router's pair layout (each on a 1-token cached prefix), a
mixed one (one past SHORT_EXTEND beside one token), and eager decode steps at batch 1 and at the
largest batch (graph capture covers its own buckets).
test/kernels/test_no_new_kernel_keys.py checks on the CPU that a mixed workload needs nothing more.

MTP depths (warm_up_mtp_kernels, from MTPWorker.capture_graphs) take the same paths, but depth d
reads the request table shifted by d + 1 columns (ForwardBatch.table_offset): a view 8 (d + 1) bytes
in, so at every even d the attention kernels see a table pointer that is not 16-byte aligned, a
Triton variant of its own (ReqToTok without "D") that the trunk never launches. Every depth runs
the extend lengths and the mixed step above on its shifted table; its verify and draft extends
(and the DepthChain's prompt chunks) need nothing more. test/kernels/test_no_new_kernel_keys_mtp.py.

Batches use the padding request row and KV slot 0, as padded CUDA-graph rows do: no request's
state is touched. An extend longer than the context allows (a short --context-length: the CUDA
threshold alone is 64 pairs per expert, about 2.7K tokens at Inkling's 256 experts and top-6) runs as
several sequences on that row in one batch, since the MoE's path follows the batch's token count.
"""

from __future__ import annotations

import torch

from sgl_inkling.layers.attention.triton_backend import SHORT_EXTEND
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.models.inkling.moe import FUSED_ROUTER_MAX_TOKENS, MoE
from sgl_inkling_kernels.fused_moe import SMALL_ALIGN_PAIRS
from sgl_inkling_kernels.fused_moe_nvfp4 import CUDA_MAX_PAIRS_PER_EXPERT
from sgl_inkling_kernels.jit_watch import log_compiles_after_warmup, warming_up
from sgl_inkling_kernels.sink_gemv import WARMUP_TOKENS as SINK_WARMUP_TOKENS


def extend_lengths(model, device: torch.device = torch.device("cpu")) -> list[int]:
    """Token counts of an extend batch, one per kernel path it can take."""
    moe = [m for m in model.modules() if isinstance(m, MoE)]
    big = max((-(-4 * m.experts.num_local // m.gate.top_k) + 1 for m in moe), default=1)
    want = {1, SHORT_EXTEND, SHORT_EXTEND + 1, FUSED_ROUTER_MAX_TOKENS + 1, big}
    for m in moe:  # the router's launch for each block size of the pair layout it makes, or for none
        first = {}
        for t in range(1, FUSED_ROUTER_MAX_TOKENS + 1):
            first.setdefault(m.align_block_m(t), t)
        want |= set(first.values())
    if device.type == "cuda":
        # Past SMALL_ALIGN_PAIRS pairs moe_align sorts in one program, a single variant for every batch,
        # expert count and block size: one batch takes it (tiny's top-2 reaches it in no other extend).
        want |= {SMALL_ALIGN_PAIRS // m.gate.top_k + 1 for m in moe}
    if device.type == "cuda" and any(m.experts.nvfp4 for m in moe):
        # Past the CUDA decode kernels of NVFP4 experts: the Triton MMA ones. Inside them the BF16
        # sinks' GEMVs compile one variant per token tile.
        want |= {-(-CUDA_MAX_PAIRS_PER_EXPERT * m.experts.num_local // m.gate.top_k) + 1 for m in moe
                 if m.experts.nvfp4}  # fmt: skip
        want |= set(SINK_WARMUP_TOKENS)
    return sorted(want)


def split_extend(n: int, max_context_len: int) -> list[int]:
    """n tokens as sequences that each fit on a 1-token cached prefix below the context limit."""
    cap = max(max_context_len - 2, 1)
    return [min(cap, n - a) for a in range(0, n, cap)]


def _extend_batches(model, dev: torch.device, max_context_len: int) -> list[list[int]]:
    """The extend batches of warm-up, as sequence lengths: one per extend length, then the mixed step."""
    out = [split_extend(n, max_context_len) for n in extend_lengths(model, dev)]
    # A mixed step: a long extension beside a 1-token one, which the attention backend runs as a
    # decode query on its own (gathered rows, a sub-batch for the extend kernel).
    out.append([*split_extend(SHORT_EXTEND + 1, max_context_len), 1])
    return out


def _pad_extend(runner, seqs: list[int]) -> ForwardBatch:
    """An extend of len(seqs) sequences on the padding row and KV slot 0, each on a 1-token cached prefix."""
    pad, n = runner.req_to_token.pad_row, sum(seqs)
    return ForwardBatch.build(ForwardMode.EXTEND, [[0] * m for m in seqs], [pad] * len(seqs), [1] * len(seqs),
                              [0] * n, [0] * n, runner.device)  # fmt: skip


def warm_up_kernels(runner, max_running_requests: int) -> None:
    """Compile, by running them once, the kernels of every extend and decode path (see above)."""
    pad, dev = runner.req_to_token.pad_row, runner.device
    ctx = runner.req_to_token.max_context_len
    with torch.no_grad(), warming_up():
        # Resuming from a 1-token prefix (conv state and KV read); a fresh sequence launches the
        # same variants (prefix lengths reach the kernels in tensors), so it needs no run of its own.
        for seqs in _extend_batches(runner.model, dev, ctx):
            runner.forward_eager(_pad_extend(runner, seqs))
        for bs in sorted({1, max_running_requests}):
            batch = ForwardBatch.build(ForwardMode.DECODE, [[0]] * bs, [pad] * bs, [1] * bs, [0] * bs, [0] * bs, dev)
            runner.forward_eager(batch)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    log_compiles_after_warmup()


def warm_up_mtp_kernels(runner, num_depths: int, trunk_capture=None, depth_capture=None) -> None:
    """Compile the kernels of the first num_depths MTP depths: every extend batch of warm-up, each
    depth on its own table offset (see above). Depths only ever run extends (verify and draft steps
    of a few tokens per request run as decode queries, prompt chunks in the extend kernel). With the
    worker's conv windows (speculative/conv_windows.py), a verify-like extend of the trunk and one of
    every depth also run with them: the short conv's extend kernel writes them itself, a variant of
    its own per window slice (their offsets in the shared buffers set the pointers' alignment)."""
    dev, hidden = runner.device, runner.model.cfg.hidden_size
    with torch.no_grad(), warming_up():
        for d in range(num_depths):
            offset = d + 1  # as DepthChain and DraftStep set ForwardBatch.table_offset
            for seqs in _extend_batches(runner.model, dev, runner.req_to_token.max_context_len - offset):
                batch = _pad_extend(runner, seqs)
                batch.table_offset = offset
                runner.forward_mtp(d, torch.zeros(sum(seqs), hidden, dtype=runner.dtype, device=dev), batch)
        if trunk_capture is not None:
            batch = _pad_extend(runner, [1])
            batch.sconv_capture = trunk_capture
            runner.forward_eager(batch)
        if depth_capture is not None:
            trunk_layers = runner.model.cfg.num_hidden_layers
            for d in range(num_depths):
                batch = _pad_extend(runner, [1])
                batch.table_offset = d + 1
                batch.sconv_capture = {trunk_layers + d: depth_capture[trunk_layers + d]}
                runner.forward_mtp(d, torch.zeros(1, hidden, dtype=runner.dtype, device=dev), batch)
        # The rollbacks (conv_rollback): one launch per run of layers, whose channel offset in the
        # state buffer sets its pointers' alignment, so every run a step rolls back: the trunk, and
        # each depth range first..end - 1 (tails, lagging.py). On the padding row, whose state is never read.
        rows = torch.full((1,), runner.req_to_token.pad_row, dtype=torch.int64, device=dev)
        kept = torch.ones(1, dtype=torch.int64, device=dev)
        if trunk_capture is not None:
            trunk_capture.restore(rows, kept)
        if depth_capture is not None:
            first_depth = runner.model.cfg.num_hidden_layers
            for first in range(num_depths):
                for end in range(first + 1, num_depths + 1):
                    depth_capture.restore(rows, kept, range(first_depth + first, first_depth + end))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
