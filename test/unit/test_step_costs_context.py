"""The start-up cost measurement's context (speculative/step_costs.py): while it holds, the padding
row reads one slot of zero keys and values at every position below the draft step's start (so each
padded row keeps its own hidden state and routing) and slot 0 from there on, where the draft step
writes; afterwards the table row and the slot pools are back as they were."""

from __future__ import annotations

import torch

from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.speculative.step_costs import _zero_context


def test_zero_context_reads_zeros_and_restores_everything(tiny_model):
    runner = ModelRunner(tiny_model, 2, 256, 1024)
    table, pools = runner.req_to_token, {"full": runner.full_pool, "swa": runner.swa_pool}
    for pool in pools.values():  # something non-zero everywhere, as after serving
        for buf in pool.k + pool.v:
            buf.normal_()
    rows = {kind: getattr(table, kind)[table.pad_row].clone() for kind in pools}
    free = {kind: pool.allocator.available for kind, pool in pools.items()}
    upto = 100
    with _zero_context(runner, upto):
        for kind, pool in pools.items():
            row = getattr(table, kind)[table.pad_row]
            z = row[:upto]
            assert torch.unique(z).numel() == 1 and int(z[0]) != 0  # one slot, not the padding slot
            assert not row[upto:].any()  # the draft step's writes still go to the padding slot
            assert pool.allocator.available == free[kind] - 1  # taken from the allocator
            for buf in pool.k + pool.v:
                assert not buf[z].any()
    for kind, pool in pools.items():
        assert torch.equal(getattr(table, kind)[table.pad_row], rows[kind])
        assert pool.allocator.available == free[kind]
