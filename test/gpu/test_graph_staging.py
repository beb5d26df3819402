"""Decode batches staged straight into the CUDA graphs' inputs (CudaGraphRunner.stage_decode) run the
same steps as eager decode batches built field by field (inkling-tiny, fp32, triton backend): the
same greedy tokens and logprobs through batch sizes that pad (3 of a bucket of 4) and shrink, with
input ids from the host (synchronous steps) and from the device (overlapped steps)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from sgl_inkling.server_args import ServerArgs  # noqa: E402
from test.unit.helpers import in_process_scheduler, random_prompt  # noqa: E402
from test.unit.test_overlap_schedule import compare, drive, req  # noqa: E402


def script() -> dict[int, list]:
    return {
        0: [req("a", random_prompt(30, seed=11), max_new_tokens=9, logprobs=2),
            req("b", random_prompt(14, seed=12), max_new_tokens=5)],
        1: [req("c", random_prompt(21, seed=13), max_new_tokens=12, logprobs=1)],
        4: [req("d", random_prompt(9, seed=14), max_new_tokens=3)],
    }  # fmt: skip


@pytest.mark.parametrize("overlap", [False, True], ids=["host-ids", "device-ids"])
def test_staged_graph_decode_equals_eager_decode(tiny_path, tmp_path_factory, overlap):
    common = dict(model_path=str(tiny_path), device="cuda", dtype="float32", max_total_tokens=8192,
                  disable_radix_cache=True)  # fmt: skip
    with in_process_scheduler(ServerArgs(**common, cuda_graph_max_bs=4), tmp_path_factory) as graphed:
        graphs, staged = graphed.runner.graphs, []
        real = graphs.replay

        def replay(batch):
            staged.append(batch.positions.data_ptr() == graphs.static["positions"].data_ptr())
            return real(batch)

        graphs.replay = replay
        got = drive(graphed, overlap, script())
    assert staged and all(staged)  # every decode step replayed a staged batch
    with in_process_scheduler(ServerArgs(**common, disable_cuda_graph=True), tmp_path_factory) as eager:
        assert eager.runner.graphs is None
        want = drive(eager, overlap, script())
    compare(want, got)
