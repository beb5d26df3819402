"""The scheduler's torch CPU threads: one on a GPU (its CPU work is per-step bookkeeping, and a team as
wide as the machine stalls at every barrier beside the server's other processes), untouched on the CPU
(where the model runs on them) and wherever OMP_NUM_THREADS is set."""

import torch

from sgl_inkling.managers.subprocess_utils import limit_host_threads


def _threads_after(device: str, monkeypatch, omp: str | None) -> tuple[int | None, int]:
    before = torch.get_num_threads()
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    torch.set_num_threads(2)
    try:
        return limit_host_threads(device), torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_a_gpu_scheduler_runs_its_cpu_ops_on_one_thread(monkeypatch):
    assert _threads_after("cuda", monkeypatch, None) == (1, 1)


def test_omp_num_threads_overrides_and_the_cpu_keeps_its_threads(monkeypatch):
    assert _threads_after("cuda", monkeypatch, "2") == (None, 2)
    assert _threads_after("cpu", monkeypatch, None) == (None, 2)
