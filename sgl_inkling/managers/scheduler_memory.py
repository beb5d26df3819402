"""How many requests and KV tokens the pools hold, from the flags or the free device memory."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from sgl_inkling.distributed.sync import min_over_ranks
from sgl_inkling.models.inkling.model import InklingForCausalLM
from sgl_inkling.server_args import DEFAULT_SCONV_CHECKPOINT_INTERVAL

logger = logging.getLogger(__name__)

# On the CPU the defaults stay small: tests and demos, not capacity.
_CPU_MAX_TOKENS = 65536
_CPU_MAX_RUNNING = 64
_CUDA_MAX_RUNNING = 256
# Sliding-KV slots per full-KV slot (beyond what running requests need). Sliding KV is 10x the bytes
# of full KV on Inkling (55 layers of 16 KV heads vs 11 of 8), and a cached path needs only the
# window before each checkpoint it keeps: with half the slots, the cache holds all of it while it
# is half full (resumable every interval), and under pressure thins old paths to their end-of-turn
# and branch checkpoints' windows and keeps their full KV, caching about 1.8x more tokens.
SWA_SHARE = 0.5


@dataclass(frozen=True)
class PoolSizes:
    max_running_requests: int
    max_total_tokens: int
    max_swa_tokens: int
    num_checkpoints: int  # short-conv snapshots the radix cache may hold
    checkpoint_interval: int  # prompt tokens between checkpoints of a cached path


def kv_bytes_per_token(model: InklingForCausalLM) -> tuple[int, int]:
    """Bytes of one token's K and V over all full layers, and over all sliding layers."""
    itemsize = model.model.llm.embed.weight.element_size()
    full = swa = 0
    for attn in model.attention_layers():
        b = 2 * attn.spec.num_kv_heads * attn.spec.head_dim * itemsize
        if attn.spec.sliding:
            swa += b
        else:
            full += b
    return full, swa


def model_sconv_bytes(model: InklingForCausalLM) -> int:
    """Bytes of one request's short-conv state on this rank (fp32, K-1 inputs of 4 streams per layer)."""
    width = model.cfg.conv_kernel_size - 1
    return sum(4 * width * sum(chans) for chans in model.sconv_channels().values())


def checkpoint_bytes(model: InklingForCausalLM, mtp_steps: int = 0) -> int:
    """Bytes of one prefix-cache checkpoint (sconv_checkpoints.py): the conv windows at the
    activations' dtype, plus MTP's carried hidden states (fp32) when speculative decoding is on."""
    itemsize = model.model.llm.embed.weight.element_size()
    width = model.cfg.conv_kernel_size - 1
    conv = sum(itemsize * width * sum(chans) for chans in model.sconv_channels().values())
    return conv + 4 * mtp_steps * model.cfg.hidden_size


def mtp_bytes_per_request(model: InklingForCausalLM, num_steps: int) -> int:
    """MTP's per-request buffers (speculative/mtp_worker.py): the conv windows captured for
    rollback (trunk layers over K + 1 verified tokens, depths over up to 2K + 1), the depths'
    carried hidden states, the drafts, and the tokens and lower levels' hiddens kept for depths that
    lag (lagging.py)."""
    width = model.cfg.conv_kernel_size - 1
    trunk = model.cfg.num_hidden_layers
    total = 0
    for layer, chans in model.sconv_channels().items():
        if layer < trunk:
            total += 4 * (width + num_steps + 1) * sum(chans)
        elif layer < trunk + num_steps:
            total += 4 * (width + 2 * num_steps + 1) * sum(chans)
    lagged = (2 * num_steps + 2) * (4 * model.cfg.hidden_size + 8)  # up to 2K + 1 tokens, one column of spill
    return total + 4 * num_steps * model.cfg.hidden_size + 8 * num_steps + lagged


def static_budget(on_cuda: bool, fraction: float, free: int, total: int) -> int:
    """Bytes the cache and the live state may take (--mem-fraction-static). On CUDA, as upstream,
    `fraction` of the GPU's memory holds the weights and the cache: what is in use already (the
    weights) comes off it, and the rest of the card stays free for activations, CUDA graphs and
    communication buffers whatever the weights' size (a fraction of the memory left after large
    weights left a prefill too little). On the CPU, `fraction` of the free memory."""
    return int(fraction * total) - (total - free) if on_cuda else int(fraction * free)


def log_memory(stage: str, device: torch.device) -> None:
    """Log the device memory after a start-up stage (as upstream's 'avail mem=' lines), so a start-up
    that runs out of memory shows which stage took it."""
    if device.type != "cuda":
        return
    free, total = _memory(device)
    gib = 2**30
    logger.info("%s: %.1f GiB allocated by this process, %.1f GiB of %.1f GiB free on %s", stage,
                torch.cuda.memory_allocated(device) / gib, free / gib, total / gib, device)  # fmt: skip


def _memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of the device."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def size_pools(model: InklingForCausalLM, args, context_len: int) -> PoolSizes:
    """One budget for the cache: full KV for `total` tokens, sliding KV for SWA_SHARE of them and a
    checkpoint every `interval` tokens over all of them; eviction (radix_eviction.py) thins
    checkpoints and the sliding KV only they need before it drops full KV, so no part runs dry
    while another has room."""
    device = next(model.parameters()).device
    on_cuda = device.type == "cuda"
    running = args.max_running_requests or (_CUDA_MAX_RUNNING if on_cuda else _CPU_MAX_RUNNING)
    full_b, swa_b = kv_bytes_per_token(model)
    window = model.cfg.sliding_window_size
    interval = args.sconv_checkpoint_interval or DEFAULT_SCONV_CHECKPOINT_INTERVAL
    chunk = args.chunked_prefill_size if args.chunked_prefill_size and args.chunked_prefill_size > 0 else 0
    chunk = chunk or args.max_prefill_tokens
    steps = (args.speculative_num_steps or model.num_mtp_layers) if args.speculative_algorithm else 0
    ckpt_b = checkpoint_bytes(model, steps)
    # Checkpoints held outside the tree at once: the snapshot points of one prefill batch (interval
    # grid, chunk ends, divergence points) and each running request's next end-of-turn checkpoint.
    in_flight = 4 * running + chunk // interval + 8
    if args.max_total_tokens:
        total = args.max_total_tokens
    else:
        fraction = args.mem_fraction_static or (0.85 if on_cuda else 0.25)
        free, capacity = _memory(device)
        budget = static_budget(on_cuda, fraction, free, capacity)
        needs = running * (window + 1) + chunk + window  # running requests' windows, a chunk in flight
        reserve = needs * swa_b + running * model_sconv_bytes(model) + in_flight * ckpt_b
        if steps:
            reserve += (running + 1) * mtp_bytes_per_request(model, steps)
        per_token = full_b + SWA_SHARE * swa_b + ckpt_b * (1 / interval + 2 / chunk)
        total = int((budget - reserve) // per_token)
        if total < chunk + window:
            gib = 2**30
            raise ValueError(
                f"--mem-fraction-static {fraction}: {budget / gib:.1f} GiB for the cache after "
                f"{(capacity - free) / gib:.1f} GiB in use of {capacity / gib:.1f} GiB, of which "
                f"{reserve / gib:.1f} GiB are set aside for {running} running requests; that leaves "
                f"{max(total, 0)} KV tokens, less than one prefill chunk ({chunk}) and a window: raise "
                f"--mem-fraction-static, or lower --max-running-requests or --chunked-prefill-size"
            )
        if not on_cuda:
            total = min(total, _CPU_MAX_TOKENS)
    # The interval grid over the whole cache, plus the checkpoint before each chunk end (a prompt
    # ending there resumes at len - 1) and the pair at each divergence point, about one per chunk.
    ckpts = -(-total // interval) + 2 * -(-total // chunk) + in_flight
    # Sliding layers keep at most window tokens per running request plus a prefill chunk in flight;
    # the radix cache keeps the window before each checkpoint, within its share.
    swa = min(total, running * (window + 1) + chunk + window + int(SWA_SHARE * total))
    sizes = PoolSizes(
        max_running_requests=running,
        max_total_tokens=total,
        max_swa_tokens=max(swa, window + 2),
        num_checkpoints=ckpts,
        checkpoint_interval=interval,
    )
    return min_over_ranks(sizes)  # TP ranks must admit the same batches
