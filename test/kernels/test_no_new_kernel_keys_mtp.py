"""MTP serving launches no Triton kernel variant start-up did not compile, checked on the CPU as
test_no_new_kernel_keys.py does for plain serving (jit_keys computes each launch's compile key).

The Scheduler starts as it serves with MTP and --disable-cuda-graph (and every batch past the
graphs' largest runs the same way), with the start-up the GPU runs: the runner's `warm_up_kernels`
(on the CPU ModelRunner skips it, so the test runs it where ModelRunner would and marks the runner
warmed up), then MTPWorker's capture_graphs, which captures nothing here. Then requests of several
prompt lengths (short prompts the depths run as decode queries, long ones in the extend kernel)
decode through verify and draft steps at batch sizes 3 and 1, one request finishing on its token
limit, and every key launched after start-up must be one start-up launched. (Graph capture warms
up only fixed-shape steps; the depths' other kernels are what this checks.)

The depths read the request table shifted by depth + 1 columns, so at depths 0 and 2 the attention
kernels see a table pointer 8 or 24 bytes into an int64 row: not 16-byte aligned, a variant of its
own that the trunk's warm-up never compiles (the `_decode_split_kernel` compile the H200 reported
after warm-up in bench_one_batch --mtp; kernel_warmup.warm_up_mtp_kernels compiles them now).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling.managers import scheduler as scheduler_mod  # noqa: E402
from sgl_inkling.managers.io_struct import TokenizedGenerateReq  # noqa: E402
from sgl_inkling.model_executor.kernel_warmup import warm_up_kernels  # noqa: E402
from sgl_inkling.model_executor.model_runner import ModelRunner  # noqa: E402
from sgl_inkling.sampling.sampling_params import SamplingParams  # noqa: E402
from sgl_inkling.server_args import ServerArgs  # noqa: E402
from sgl_inkling_kernels._triton import kernel_dispatch  # noqa: E402
from sgl_inkling_kernels.jit_keys import KeyLog, record_keys  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU watches real compiles (test/gpu)")

MAX_REQS = 4
NUM_STEPS = 3  # depths 0 (sliding), 1 and 2 (full) of inkling-tiny: table offsets 1, 2 and 3


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 199_990, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _start_up_as_on_the_gpu(monkeypatch) -> None:
    """ModelRunner as the Scheduler builds it on the GPU: kernels warmed up at start-up."""

    def runner_factory(*args, **kwargs):
        kwargs.update(kernel_warmup=False, cuda_graph_max_bs=0)  # CUDA-only: run below instead
        runner = ModelRunner(*args, **kwargs)
        warm_up_kernels(runner, args[1])
        runner.kernel_warmup = True  # as ModelRunner marks it on the GPU
        return runner

    monkeypatch.setattr(scheduler_mod, "ModelRunner", runner_factory)


def _submit(s, rid: str, prompt: list[int], max_new_tokens: int) -> None:
    sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, "max_new_tokens": max_new_tokens})
    s.handle(TokenizedGenerateReq(rid=rid, input_ids=prompt, sampling_params=sp))


def _serve(s) -> None:
    """Three requests (prompts of 5, 30 and 13 tokens: decode queries and the extend kernel at the
    depths, a mixed prefill), decoded together until the shortest finishes (its token limit),
    then one more alone: verify and draft steps at batch 3 and batch 1."""
    for i, (n, new) in enumerate([(5, 3), (30, 40), (13, 40)]):
        _submit(s, str(i), _tokens(n, i), new)
    steps = 0
    while len(s.running) + len(s.waiting) + len(s.partial) > 0 and steps < 10:
        if len(s.running) == 2:  # the first finished: leave one request
            s.abort("1")
        s.step()
        s.outbox.clear()
        steps += 1
    s.abort("", abort_all=True)


@pytest.mark.parametrize("draft_quant", [None, "fp8"])  # fp8: the depths' W8A16 GEMV (fp8_gemv.py) too
def test_mtp_serves_without_new_kernel_variants(tiny_path, tmp_path, monkeypatch, draft_quant):
    _start_up_as_on_the_gpu(monkeypatch)
    args = ServerArgs(model_path=str(tiny_path), device="cpu", attention_backend="triton", speculative_algorithm="MTP",
                      speculative_num_steps=NUM_STEPS, max_running_requests=MAX_REQS, context_length=256,
                      disable_cuda_graph=True, speculative_draft_model_quantization=draft_quant)  # fmt: skip
    args.check()
    with torch.no_grad(), kernel_dispatch(True), record_keys() as log:
        s = scheduler_mod.Scheduler(args, args.model_path, f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
        try:
            warm, n_warm = log.keys(), len(log.launches)
            _serve(s)
            spec = s.spec.stats()
        finally:
            s.recv_sock.close(0)
            s.send_sock.close(0)
    assert spec["spec_verify_steps"] >= 4
    if draft_quant == "fp8":
        assert any("_fp8_gemv_kernel" in key.kernel for key in warm)
    new = KeyLog(log.launches[n_warm:]).new_since(warm)
    assert len(log.launches) - n_warm > 100
    assert new == [], "\n".join(new)
