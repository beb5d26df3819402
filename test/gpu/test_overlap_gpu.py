"""Overlap scheduling on CUDA (inkling-tiny, fp32, triton backend, CUDA graphs): an overlapped decode
step waits for the device only where it reads the previous step's tokens (commit_pending); building
and launching the next forward, its sampling and the start of its host copies run under
torch.cuda.set_sync_debug_mode("error"). Outputs equal the synchronous path's."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from sgl_inkling.server_args import ServerArgs  # noqa: E402
from test.unit.helpers import in_process_scheduler, random_prompt  # noqa: E402
from test.unit.test_overlap_schedule import compare, drive, req  # noqa: E402

from .test_sampler_sync import sync_is_error  # noqa: E402


def commit_may_wait(s, monkeypatch) -> None:
    """Under sync_is_error, let the scheduler's commit (and only it) wait for the device."""
    real = s.commit_pending

    def commit_allowed_to_wait() -> None:
        torch.cuda.set_sync_debug_mode(0)
        try:
            real()
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(s, "commit_pending", commit_allowed_to_wait)


@pytest.fixture(scope="module")
def gpu_sched(tiny_path, tmp_path_factory):
    args = ServerArgs(model_path=str(tiny_path), device="cuda", dtype="float32", cuda_graph_max_bs=4,
                      max_total_tokens=8192)
    with in_process_scheduler(args, tmp_path_factory) as s:
        yield s


def test_overlapped_decode_steps_do_not_sync_outside_the_commit(gpu_sched, monkeypatch):
    s = gpu_sched
    assert s.overlap and s.runner.graphs is not None
    for i in range(3):
        s.handle(req(f"n{i}", random_prompt(20 + i, seed=900 + i), max_new_tokens=12, logprobs=2 if i else None))
    while s.waiting:
        s.step()  # prefill (reads its first tokens back)
    s.step()  # a first overlapped step: warm-up of the pinned pool and the sampling kernels
    commit_may_wait(s, monkeypatch)
    with sync_is_error():
        for _ in range(4):
            s.run_decode()
    assert s.pending is not None
    monkeypatch.undo()
    while s.running:
        s.step()
    s.outbox.clear()


def test_overlapped_mixed_steps_do_not_sync_outside_the_commit(gpu_sched, monkeypatch):
    """A prompt arriving while others decode: its chunk and their tokens run as one mixed step, whose
    batch building, KV allocation, launch and prefix caching must not wait for the step in flight
    either (at concurrency 64 the served prefill phase ran 0.8 s longer than its prefills alone)."""
    s = gpu_sched
    assert s.overlap and s.mixed_chunk
    for i in range(3):
        s.handle(req(f"m{i}", random_prompt(20 + i, seed=910 + i), max_new_tokens=16))
    while s.waiting:
        s.step()
    s.step()  # an overlapped decode step in flight
    mixed_before = s.mixed_counts["num_mixed_steps"]
    commit_may_wait(s, monkeypatch)
    with sync_is_error():
        for i in range(2):  # a prompt a step: two mixed steps back to back, then a decode step
            s.handle(req(f"p{i}", random_prompt(300 + i, seed=920 + i), max_new_tokens=4))
            s.step()
        s.step()
    monkeypatch.undo()
    assert s.mixed_counts["num_mixed_steps"] >= mixed_before + 2
    while s.running or s.pending is not None:
        s.step()
    s.outbox.clear()


def test_overlap_equals_sync_on_cuda(gpu_sched):
    s = gpu_sched
    script = {
        0: [req("a", random_prompt(30, seed=1), max_new_tokens=10, logprobs=3),
            req("b", random_prompt(12, seed=2), max_new_tokens=4)],
        2: [req("c", random_prompt(18, seed=3), max_new_tokens=7, temperature=0.7, seed=4)],
    }  # fmt: skip
    compare(drive(s, False, script), drive(s, True, script))
