"""No kernel launch after start-up warm-up needs a Triton variant warm-up did not compile, checked on
the CPU: the GPU test (test/gpu/test_kernel_warmup.py) watches real compiles, which the interpreter
never does, so here `jit_keys` computes each launch's compile key from its arguments by Triton's
rules. A ModelRunner warms up (`warm_up_kernels`) and "captures" its decode buckets (the capture
runs eagerly: the graph runner's own padding, then the same forward), then serves a mixed workload:
cold and chunked prefills on each kernel path at both parities and a multiple of 16 tokens, ragged
extends mixing chunks with single tokens, verify-like short extensions at several widths, and
decode at every batch size inside and beyond the graph buckets. Every key after warm-up must be one
warm-up saw. Run on inkling-tiny and on a narrow config with Inkling's attention geometry
(window 512, extent 1024, d_rel 16, head_dim 128, 8 and 4 query heads per KV head, 256 experts of
which 6 routed and 2 sinks), with split counts that vary with the batch as on the GPU.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from sgl_inkling.model_executor import cuda_graph_runner  # noqa: E402
from sgl_inkling.model_executor.cuda_graph_runner import CudaGraphRunner  # noqa: E402
from sgl_inkling.model_executor.kernel_warmup import warm_up_kernels  # noqa: E402
from sgl_inkling.model_executor.model_loader import build_model  # noqa: E402
from sgl_inkling.model_executor.model_runner import ModelRunner  # noqa: E402
from sgl_inkling.model_executor.seq_runner import SeqRunner  # noqa: E402
from sgl_inkling.models.inkling.config import InklingConfig  # noqa: E402
from sgl_inkling.models.inkling.tiny import TINY_CONFIG  # noqa: E402
from sgl_inkling.models.inkling.weights import init_dummy_weights  # noqa: E402
from sgl_inkling_kernels._triton import kernel_dispatch  # noqa: E402
from sgl_inkling_kernels.jit_keys import KeyLog, record_keys  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU watches real compiles (test/gpu)")

# For the geometry: more SMs than the CPU backend's default (4), fewer than the H200's 132 (the
# interpreter pays for every split): decode then splits 1 to 16 ways across the batch sizes below.
NUM_SMS = 16

GEOMETRY = copy.deepcopy(TINY_CONFIG)
GEOMETRY["text_config"].update(
    hidden_size=64, num_hidden_layers=2, layer_types=["hybrid_sliding", "hybrid"],
    mlp_layer_types=["dense", "sparse"], num_attention_heads=8, num_key_value_heads=1, head_dim=128,
    swa_num_attention_heads=8, swa_num_key_value_heads=2, swa_head_dim=128, sliding_window_size=512,
    d_rel=16, rel_extent=1024, log_scaling_n_floor=None, n_routed_experts=32, num_experts_per_tok=6,
    n_shared_experts=2, moe_intermediate_size=32, max_position_embeddings=131072,
)  # fmt: skip
GEOMETRY["mtp_config"] = {}
GEOMETRY["vision_config"], GEOMETRY["audio_config"] = {}, {}


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 199_990, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class _EagerGraph:
    """A captured decode step replayed by running it again (the interpreter has no graphs): the
    graph runner still pads batches to its buckets and reads its static buffers, as on the GPU."""

    def __init__(self, runner, batch):
        self.runner, self.batch = runner, batch
        self.out = runner.forward_eager(batch)

    def replay(self) -> None:
        new = self.runner.forward_eager(self.batch)
        self.out.logits.copy_(new.logits)
        self.out.hidden.copy_(new.hidden)


def _eager_capture(runner, batch, pool=None):
    g = _EagerGraph(runner, batch)
    return g, g.out


def _serving_runner(model, max_reqs: int, graph_bs: int, num_sms: int | None, monkeypatch) -> ModelRunner:
    """A ModelRunner set up as on the GPU: warm-up, then one "capture" per decode bucket."""
    runner = ModelRunner(model, max_reqs, 1024, 4096, attention_backend="triton", kernel_warmup=False)
    runner.attn_backend.num_sms = num_sms or runner.attn_backend.num_sms  # decode's split counts follow it
    warm_up_kernels(runner, max_reqs)
    monkeypatch.setattr(cuda_graph_runner, "capture_forward", _eager_capture)
    runner.graphs = CudaGraphRunner(runner, graph_bs)
    return runner


def _workload(runner: ModelRunner, cold: list[int], max_reqs: int) -> None:
    seqs = SeqRunner(runner)
    live = [seqs.new_seq() for _ in range(max_reqs)]
    try:
        for i, n in enumerate(cold):  # one cold prefill per length
            seqs.step([live[i]], [_tokens(n, i)])
        seqs.step([live[0]], [_tokens(40, 50)])  # chunked: resumes from a cached prefix
        seqs.step(live[1:4], [_tokens(30, 51), [7], _tokens(5, 52)])  # a chunk beside single tokens
        for width, bs in ((2, 2), (4, 4)):  # MTP-verify-like: every sequence brings the same few tokens
            seqs.step(live[:bs], [_tokens(width, 60 + width + j) for j in range(bs)])
        for bs in range(1, max_reqs + 1):  # graph buckets, padded, and eager decode beyond them
            seqs.step(live[:bs], [[11]] * bs)
    finally:
        for s in live:
            seqs.free(s)


def _new_keys(
    model, cold: list[int], max_reqs: int, graph_bs: int, monkeypatch, num_sms: int | None = None
) -> tuple[list[str], int]:
    """Each key first launched after warm-up and capture that they never launched (with what differs
    from the nearest one they did), and how many launches the workload made."""
    with torch.no_grad(), kernel_dispatch(True), record_keys() as log:
        runner = _serving_runner(model, max_reqs, graph_bs, num_sms, monkeypatch)
        warm, n_warm = log.keys(), len(log.launches)
        _workload(runner, cold, max_reqs)
    assert runner.req_to_token.available == max_reqs  # every request row back
    return KeyLog(log.launches[n_warm:]).new_since(warm), len(log.launches) - n_warm


def test_tiny_serves_without_new_kernel_variants(tiny_model, monkeypatch):
    # 3 and 16: decode queries (<= 24 tokens) with the router's GEMV (<= 16 tokens); 32 and 80: past
    # both (cuBLAS routes them). Lengths 1, 24, 25, 17 and the MoE's limit are warm-up's own.
    new, launched = _new_keys(tiny_model, [3, 16, 32, 80], max_reqs=6, graph_bs=4, monkeypatch=monkeypatch)
    assert launched > 100
    assert new == [], "\n".join(new)


def test_inkling_geometry_serves_without_new_kernel_variants(monkeypatch):
    model = build_model(InklingConfig.from_dict(copy.deepcopy(GEOMETRY)), torch.bfloat16, "cpu")
    init_dummy_weights(model)
    new, launched = _new_keys(model, [3, 16, 33], max_reqs=5, graph_bs=4, monkeypatch=monkeypatch, num_sms=NUM_SMS)
    assert launched > 50
    assert new == [], "\n".join(new)


def test_an_odd_largest_graph_bucket_captures_no_new_variants(tiny_model, monkeypatch):
    """The decode graphs' static inputs are one block of fields; with an odd largest bucket
    (--cuda-graph-max-bs or --max-running-requests 3) a row of 3 int64 left every other field
    8-byte aligned, so the capture compiled pointer variants warm-up never had."""
    max_reqs = 3
    with torch.no_grad(), kernel_dispatch(True), record_keys() as log:
        runner = ModelRunner(tiny_model, max_reqs, 1024, 4096, attention_backend="triton", kernel_warmup=False)
        warm_up_kernels(runner, max_reqs)
        warm, n_warm = log.keys(), len(log.launches)
        monkeypatch.setattr(cuda_graph_runner, "capture_forward", _eager_capture)
        runner.graphs = CudaGraphRunner(runner, max_reqs)
    assert runner.graphs.buckets[-1] == max_reqs and len(log.launches) > n_warm
    new = KeyLog(log.launches[n_warm:]).new_since(warm)
    assert new == [], "\n".join(new)
