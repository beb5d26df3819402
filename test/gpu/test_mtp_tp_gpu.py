"""MTP with `--tp-size 2` on two GPUs (NCCL, CUDA graphs for decode and verify): greedy output equals a
TP 1 engine without MTP in float32 on inkling-tiny-draftable, and sampled requests leave both ranks
having emitted the same tokens (rank 0's seed drives every rank's rejection sampling)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, 199_990, (8 + (41 * i) % 150,), generator=g).tolist() for i in range(n)]


def _engine_run(path: str, jobs: list[tuple[list, dict]], **server) -> tuple[list, dict]:
    import sglang as sgl

    eng = sgl.Engine(model_path=path, dtype="float32", **server)
    try:
        outs = [eng.generate(input_ids=prompts, sampling_params=params) for prompts, params in jobs]
        info = eng.get_server_info()["internal_states"][0]
    finally:
        eng.shutdown()
    return outs, info


def test_tp2_mtp_greedy_equals_tp1_and_ranks_agree():
    from sgl_inkling.models.inkling.tiny_draftable import ensure_draftable_checkpoint

    path = str(ensure_draftable_checkpoint())
    greedy = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
    jobs = [(_prompts(1), greedy), (_prompts(16), greedy)]
    want, _ = _engine_run(path, jobs)
    sampled = (_prompts(8), {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 48, "ignore_eos": True})
    got, info = _engine_run(path, [*jobs, sampled], tp_size=2, speculative_algorithm="MTP")
    for w, g in zip(want, got):
        assert [o["output_ids"] for o in g] == [o["output_ids"] for o in w]
    assert all(o["meta_info"]["completion_tokens"] == 48 for o in got[-1])
    assert info["spec_verify_cuda_graph"]
    assert info["avg_spec_accept_length"] > 1.0
    assert info["tp_ranks_agree"]
