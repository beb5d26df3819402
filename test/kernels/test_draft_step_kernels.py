"""The fixed-shape MTP draft step through the Triton kernels (the interpreter on the CPU) at a batch of
three padded to bucket 4, with tails: what the CUDA draft graphs run. The unit tests run the same
step on the torch path, which reads every index tensor through its strides; the kernels read them at
unit stride, so a batch above one is where a step handing them views differs (the H200 capture at
batch 2 and up hit an illegal address that way, 15e9275).

Only the draft step takes the kernels here (the trunk's verify and the cold prefill stay on the torch
path), replayed from the graph runner's static buffers as on the GPU. Reference: after the tails catch
up, every level of each request holds the state a cold prefill of its tokens computes, within the
kernels' float32 rounding.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling_kernels._triton import kernel_dispatch  # noqa: E402
from test.unit.helpers import (  # noqa: E402
    assert_same_level_state,
    draftable_scheduler,
    random_prompt,
    replaying_graph_runner,
)
from test.unit.test_mtp_plain_steps import at_baseline, force_picks, step, submit  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the draft graphs themselves")


@pytest.fixture(scope="module")
def sched(tmp_path_factory):
    yield from draftable_scheduler(tmp_path_factory)


def test_draft_step_kernels_at_a_batch_of_three_hold_a_cold_prefills_state(sched, monkeypatch):
    s, spec = sched, sched.spec
    assert s.runner.dtype == torch.float32
    spec.fixed_shapes = True
    graphs = spec.draft_graphs = replaying_graph_runner(spec)
    real_run = spec.step.run

    def run_on_kernels(*args, **kw):
        with kernel_dispatch(True):
            return real_run(*args, **kw)

    monkeypatch.setattr(spec.step, "run", run_on_kernels)  # the tails' catch-ups call it too
    try:
        force_picks(s, monkeypatch, [3, 3, 5, 2])  # tails of several k lag, and catch up when k changes
        reqs = [submit(s, f"r{i}", random_prompt(n, seed=40 + i), max_new_tokens=400) for i, n in enumerate((21, 34, 27))]
        for _ in range(100):
            if min(len(r.output_ids) for r in reqs) >= 12 and any(r.depth_lag for r in reqs):
                break
            step(s)
        else:
            pytest.fail("no tail lagging after 100 steps")
        assert 4 in graphs.replayed, graphs.replayed  # three requests pad to bucket 4
        spec.catch_up_tails(reqs)
        assert all(r.depth_lag == 0 for r in reqs)
    finally:
        spec.draft_graphs = None
        spec.fixed_shapes = False
        monkeypatch.undo()
    for i, r in enumerate(reqs):
        q = r.kv_len
        cold = submit(s, f"cold{i}", r.fill_ids[:q], max_new_tokens=2)
        assert s.run_prefill()
        assert cold.kv_len == q
        assert_same_level_state(s.runner, r.row, cold.row, q, tol=1e-4)
    s.abort("", abort_all=True)
    assert at_baseline(s)
