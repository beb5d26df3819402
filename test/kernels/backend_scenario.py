"""One scenario through the real model, for comparing attention backends on inkling-tiny.

Cold prefills that cross the sliding window (16) and the full layers' bias extent (32), a chunked
prefill resuming from a cached prefix, a ragged extend batch, batched decode steps, then a mixed
step (a cold prefill beside one decode token per running sequence).
"""

from __future__ import annotations

import torch

from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner


def random_tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 199_990, (n,), generator=g).tolist()


def run_scenario(
    model, backend: str, decode_steps: int = 6, forced: list[list[int]] | None = None
) -> tuple[list[torch.Tensor], list[list[int]]]:
    """All logits the scenario produces (in order) and each sequence's greedy continuation.

    With `forced`, decode feeds those tokens (teacher forcing) instead of its own argmax, so two
    runs whose greedy choices could flip on a near-tie still see identical inputs.
    """
    runner = SeqRunner(ModelRunner(model, 8, 1024, 4096, attention_backend=backend))
    seqs = [runner.new_seq() for _ in range(3)]
    logits: list[torch.Tensor] = []
    # Sequence 0: one cold prefill of 45 tokens, all positions' logits.
    logits.append(runner.step([seqs[0]], [random_tokens(45, 1)], all_logits=True).logits.cpu())
    # Sequence 1: chunked prefill (20 then 19 tokens on top of the cached 20).
    runner.step([seqs[1]], [random_tokens(20, 2)])
    logits.append(runner.step([seqs[1]], [random_tokens(19, 3)], all_logits=True).logits.cpu())
    # Ragged extend: sequence 2 cold (7 tokens) with sequence 0 extended by 3 and sequence 1 by 1.
    out = runner.step([seqs[2], seqs[0], seqs[1]], [random_tokens(7, 4), random_tokens(3, 5), [11]], all_logits=True)
    logits.append(out.logits.cpu())
    # Batched greedy decode.
    generated: list[list[int]] = [[], [], []]
    last = out.logits[[6, 9, 10]]
    for step in range(decode_steps):
        toks = last.argmax(-1).tolist() if forced is None else [f[step] for f in forced]
        for g, t in zip(generated, toks):
            g.append(t)
        out = runner.step(seqs, [[t] for t in toks])
        logits.append(out.logits.cpu())
        last = out.logits
    # A mixed step: a fourth sequence's cold prefill, longer than the Triton backend's short
    # extensions, with one decode token for each of the others (they take the decode kernel there).
    seqs.append(runner.new_seq())
    toks = last.argmax(-1).tolist()
    out = runner.step([seqs[3], *seqs[:3]], [random_tokens(40, 6), *([t] for t in toks)], all_logits=True)
    logits.append(out.logits.cpu())
    for s in seqs:
        runner.free(s)
    return logits, generated
