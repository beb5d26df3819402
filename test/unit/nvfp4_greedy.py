"""A batched greedy run of 64 tokens, in-process (TP 1) or in each spawned gloo rank (TP 2, through
tp_scenario.run_ranks), for the NVFP4 model tests. Logits of every eighth step come back for
comparison (all of them are 100 MB)."""

from __future__ import annotations

import torch

from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner
from test.unit.helpers import random_prompt

NEW_TOKENS = 64
PROMPTS = [random_prompt(40, 61), random_prompt(9, 62)]  # longer and shorter than the window (16)


def greedy_batch(model) -> dict:
    runner = SeqRunner(ModelRunner(model, 4, 256, 1024))
    seqs = [runner.new_seq(), runner.new_seq()]
    out = runner.step(seqs, PROMPTS)
    tokens, logits = [], []
    for step in range(NEW_TOKENS):
        if step % 8 == 0 or step == NEW_TOKENS - 1:
            logits.append(out.logits.clone())
        tokens.append(out.logits.argmax(-1).tolist())
        if step < NEW_TOKENS - 1:
            out = runner.step(seqs, [[t] for t in tokens[-1]])
    return {"tokens": [list(t) for t in zip(*tokens)], "logits": torch.stack(logits)}

