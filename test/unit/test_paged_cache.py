"""Cached execution equals cold execution bit for bit: decode steps, chunked extends, mixed batches, MTP."""

from __future__ import annotations

import torch

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode

from .helpers import prompt_logits, random_prompt, seq_runner


def assert_close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """Bitwise: in fp32 on the CPU every kernel is batch-invariant, so caching changes no bit."""
    err = (ours - ref).abs().max().item()
    assert torch.equal(ours, ref), f"{what}: not bitwise equal (max difference {err:.3g})"


def test_prefill_then_decode_equals_one_prefill(tiny_model):
    runner = seq_runner(tiny_model)
    n, m = 29, 20  # decode runs past the 16-token window and the 32-token rel_extent
    tokens = random_prompt(n + m, seed=7)
    cold = prompt_logits(runner, tokens)
    seq = runner.new_seq()
    steps = [runner.step([seq], [tokens[:n]]).logits[-1]]
    steps += [runner.step([seq], [[t]]).logits[-1] for t in tokens[n:-1]]
    runner.free(seq)
    assert_close(torch.stack(steps), cold[n - 1 : -1], "decode vs prefill")


def test_chunked_extends_equal_one_extend(tiny_model):
    runner = seq_runner(tiny_model)
    tokens = random_prompt(70, seed=8)
    cold = prompt_logits(runner, tokens)
    seq = runner.new_seq()
    pieces, start = [], 0
    for size in (3, 1, 13, 22, 31):  # odd chunk sizes: boundaries inside windows and conv spans
        pieces.append(runner.step([seq], [tokens[start : start + size]], all_logits=True).logits)
        start += size
    runner.free(seq)
    assert_close(torch.cat(pieces), cold, "chunked extend vs one extend")


def test_mixed_batches_equal_each_sequence_alone(tiny_model):
    runner = seq_runner(tiny_model)
    prompts = [random_prompt(n, seed=20 + n) for n in (9, 17, 40)]
    prefixes = [4, 0, 33]
    alone = [prompt_logits(runner, p) for p in prompts]
    seqs = [runner.new_seq() for _ in prompts]
    # Sequences with cached prefixes of different lengths extend together...
    for s, p, k in zip(seqs, prompts, prefixes):
        if k:
            runner.step([s], [p[:k]])
    out = runner.step(seqs, [p[k:-3] for p, k in zip(prompts, prefixes)], all_logits=True)
    offset = 0
    for p, k, ref in zip(prompts, prefixes, alone):
        n = len(p) - 3 - k
        assert_close(out.logits[offset : offset + n], ref[k:-3], f"extend of len {len(p)}")
        offset += n
    # ...then decode together for the last three tokens.
    for j in (3, 2, 1):
        logits = runner.step(seqs, [[p[-j]] for p in prompts]).logits
        for row, ref in zip(logits, alone):
            assert_close(row, ref[-j], "batched decode")
    for s in seqs:
        runner.free(s)


def test_pools_return_to_baseline(tiny_model):
    runner = seq_runner(tiny_model)
    r = runner.runner
    base = (r.full_pool.allocator.available, r.swa_pool.allocator.available, r.req_to_token.available)
    runner.greedy(random_prompt(12, seed=3), max_new_tokens=5)
    assert (r.full_pool.allocator.available, r.swa_pool.allocator.available, r.req_to_token.available) == base


def _mtp_batch(runner, seq, next_tokens, prefix, all_logits=True):
    """Depth-0 batch that reuses the sequence's slots (MTP layers have their own pool layers)."""
    n = len(next_tokens)
    r = runner.runner
    rows = [seq.row]
    full = r.req_to_token.full[seq.row, prefix : prefix + n].tolist()
    swa = r.req_to_token.swa[seq.row, prefix : prefix + n].tolist()
    mode = ForwardMode.DECODE if n == 1 and not all_logits else ForwardMode.EXTEND
    return ForwardBatch.build(mode, [next_tokens], rows, [prefix], full, swa, r.device, all_logits=all_logits)


def test_mtp_depth_decode_equals_extend(tiny_model):
    """Each MTP depth keeps its own KV and short-conv state through the paged caches."""
    runner = seq_runner(tiny_model)
    tokens = random_prompt(45, seed=11)
    seq = runner.new_seq()
    hidden = runner.step([seq], [tokens], all_logits=True).hidden
    r = runner.runner
    # Cold: the whole chain over positions 0..43 (token t pairs with token t+1).
    cold = r.forward_mtp(0, hidden[:-1], _mtp_batch(runner, seq, tokens[1:], 0)).logits
    # Cached: a 30-token extend, then one decode step per position, through the same slots.
    chunk = r.forward_mtp(0, hidden[:30], _mtp_batch(runner, seq, tokens[1:31], 0)).logits
    steps = [
        r.forward_mtp(
            0, hidden[t : t + 1], _mtp_batch(runner, seq, [tokens[t + 1]], t, all_logits=False)
        ).logits
        for t in range(30, 44)
    ]
    runner.free(seq)
    assert_close(torch.cat([chunk, *steps]), cold, "MTP depth 0 cached vs cold")
    assert tiny_model.num_mtp_layers == 8


def test_bf16_runs_through_the_caches(tiny_path):
    from sgl_inkling.model_executor.model_loader import load_model

    runner = seq_runner(load_model(tiny_path, torch.bfloat16, "cpu", progress=False))
    tokens = random_prompt(24, seed=5)
    cold = prompt_logits(runner, tokens)
    seq = runner.new_seq()
    runner.step([seq], [tokens[:20]])
    steps = torch.stack([runner.step([seq], [[t]]).logits[-1] for t in tokens[20:]])
    runner.free(seq)
    assert steps.dtype == torch.float32 and torch.isfinite(steps).all()
    # Same model, different bf16 rounding paths: logits agree to a few percent of their scale.
    assert (steps - cold[20:]).abs().max() <= 0.1 * cold.abs().max()
