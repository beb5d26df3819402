"""Conv checkpoints hold the conv inputs at the activations' dtype and restore them bit-exactly; the
pools are sized so a checkpoint every interval fits over the whole cache."""

from __future__ import annotations

import pytest
import torch

from sgl_inkling.managers.scheduler_memory import checkpoint_bytes, size_pools
from sgl_inkling.mem_cache.memory_pool import SConvStatePool
from sgl_inkling.mem_cache.sconv_checkpoints import SConvCheckpointPool
from sgl_inkling.server_args import DEFAULT_SCONV_CHECKPOINT_INTERVAL, ServerArgs


def live_pool() -> SConvStatePool:
    pool = SConvStatePool(3, {0: (4, 4, 6, 6), 1: (2, 2, 6, 6)}, 4, "cpu")
    pool.add_state("mtp_carry", (2, 6))  # hidden states: fp32 values, not bf16 activations
    g = torch.Generator().manual_seed(0)
    for layer, ts in pool.states.items():
        for t in ts:
            x = torch.randn(t.shape, generator=g)
            t.copy_(x.bfloat16().float() if isinstance(layer, int) else x)  # what a bf16 model stores
    return pool


def test_bf16_checkpoints_restore_bit_exactly_at_half_the_bytes():
    live = live_pool()
    half = SConvCheckpointPool(4, live, torch.bfloat16)
    full = SConvCheckpointPool(4, live, torch.float32)
    assert all(t.dtype == torch.bfloat16 for layer in (0, 1) for t in half.store[layer])
    assert half.store["mtp_carry"][0].dtype == torch.float32
    conv = sum(t[0].numel() for layer in (0, 1) for t in live.states[layer])
    carry = live.states["mtp_carry"][0][0].numel()
    assert half.bytes_per_checkpoint() == 2 * conv + 4 * carry
    assert full.bytes_per_checkpoint() == 4 * conv + 4 * carry
    slot = half.save(0)
    half.restore(slot, 2)
    for ts in live.states.values():
        for t in ts:
            assert torch.equal(t[2], t[0])


def test_pools_hold_a_checkpoint_every_interval_over_the_whole_cache(tiny_model):
    args = ServerArgs(device="cpu", max_total_tokens=4000, max_running_requests=2)
    args.check()
    sizes = size_pools(tiny_model, args, 4096)
    assert sizes.checkpoint_interval == DEFAULT_SCONV_CHECKPOINT_INTERVAL == 128
    assert sizes.num_checkpoints * sizes.checkpoint_interval >= sizes.max_total_tokens
    # ...plus the snapshots of one prefill chunk and each running request's end of turn.
    assert sizes.num_checkpoints - 4000 // 128 >= 512 // 128 + 2
    # Sliding KV: what running requests need, plus a share of the cache (thinned under pressure).
    big = ServerArgs(device="cpu", max_total_tokens=40000, max_running_requests=2)
    big.check()
    window = tiny_model.cfg.sliding_window_size
    swa = size_pools(tiny_model, big, 4096).max_swa_tokens
    assert 2 * (window + 1) + 512 < swa < 40000
    width = tiny_model.cfg.conv_kernel_size - 1
    chans = sum(sum(c) for c in tiny_model.sconv_channels().values())
    assert checkpoint_bytes(tiny_model) == 4 * width * chans  # fp32 model: fp32 inputs


def test_a_fraction_that_leaves_no_cache_is_refused_naming_the_flag(tiny_model):
    args = ServerArgs(device="cpu", mem_fraction_static=1e-9, max_running_requests=2)
    args.check()
    with pytest.raises(ValueError, match="--mem-fraction-static"):
        size_pools(tiny_model, args, 4096)
    args = ServerArgs(device="cpu", mem_fraction_static=0.05, max_running_requests=2)
    args.check()
    assert size_pools(tiny_model, args, 4096).max_total_tokens > 512  # a few GiB of RAM: room enough
