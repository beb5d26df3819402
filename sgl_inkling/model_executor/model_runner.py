"""Owns the model, its memory pools and attention backend; runs one ForwardBatch at a time."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from sgl_inkling.layers.attention.base import AttentionBackend
from sgl_inkling.layers.attention.torch_native import TorchNativeBackend
from sgl_inkling.mem_cache.memory_pool import KVLayout, KVPool, ReqToTokenPool, SConvStatePool
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.model_executor.step_faults import FaultInjector, model_step
from sgl_inkling.models.inkling.model import InklingForCausalLM, ModelOutput

logger = logging.getLogger(__name__)


def _triton_backend(*args) -> AttentionBackend:
    # Imported on use: the Triton kernels (and Triton itself) are optional on CPU-only installs.
    from sgl_inkling.layers.attention.triton_backend import TritonBackend

    return TritonBackend(*args)


ATTENTION_BACKENDS: dict[str, Callable[..., AttentionBackend]] = {
    "torch_native": TorchNativeBackend,
    "triton": _triton_backend,
}


def _kv_layout(layers: list, sliding: bool) -> KVLayout:
    """From the modules, not the config: under TP they hold this rank's KV heads."""
    spec = next((a.spec for a in layers if a.spec.sliding == sliding), None)
    return KVLayout(spec.num_kv_heads, spec.head_dim) if spec else KVLayout(0, 0)


class ModelRunner:
    def __init__(
        self,
        model: InklingForCausalLM,
        max_running_requests: int,
        max_context_len: int,
        max_total_tokens: int,
        max_swa_tokens: int | None = None,
        attention_backend: str = "torch_native",
        cuda_graph_max_bs: int = 0,
        kernel_warmup: bool = True,
        cuda_graph_bs: Sequence[int] | None = None,
    ):
        """`kernel_warmup`: on CUDA with the triton backend, compile every kernel serving can reach
        before the first request (model_executor/kernel_warmup.py). `cuda_graph_bs` (--cuda-graph-bs):
        the decode batch sizes captured, in place of the standard buckets up to cuda_graph_max_bs."""
        if attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"unknown attention backend {attention_backend!r}; choose from {list(ATTENTION_BACKENDS)}"
            )
        self.model = model
        cfg = model.cfg
        param = next(model.parameters())
        self.device, self.dtype = param.device, model.model.llm.embed.weight.dtype
        layers = model.attention_layers()
        full_ids = [a.spec.layer_id for a in layers if not a.spec.sliding]
        swa_ids = [a.spec.layer_id for a in layers if a.spec.sliding]
        self.req_to_token = ReqToTokenPool(max_running_requests, max_context_len, self.device)
        self.full_pool = KVPool(
            max_total_tokens,
            full_ids,
            _kv_layout(layers, sliding=False),
            self.dtype,
            self.device,
        )
        self.swa_pool = KVPool(
            max_swa_tokens or max_total_tokens,
            swa_ids,
            _kv_layout(layers, sliding=True),
            self.dtype,
            self.device,
        )
        # +1: the padding row of CUDA-graph batches has a state row too.
        self.sconv_pool = SConvStatePool(
            max_running_requests + 1, model.sconv_channels(), cfg.conv_kernel_size, self.device
        )
        self.attn_backend = ATTENTION_BACKENDS[attention_backend](
            self.req_to_token, self.full_pool, self.swa_pool
        )
        self.faults = FaultInjector()  # test-only failure injection (off unless its env var is set)
        # Whether start-up compiles every kernel serving reaches (MTPWorker warms its depths up on it too).
        self.kernel_warmup = kernel_warmup and attention_backend == "triton" and self.device.type == "cuda"
        if self.kernel_warmup:
            from sgl_inkling.model_executor.kernel_warmup import warm_up_kernels

            warm_up_kernels(self, max_running_requests)
        self.graphs = None
        if cuda_graph_max_bs > 0 and self.device.type == "cuda":
            from sgl_inkling.model_executor.cuda_graph_runner import CudaGraphRunner

            if attention_backend != "triton":
                raise ValueError(
                    "CUDA graphs need --attention-backend triton (torch_native syncs with the host)"
                )
            buckets = None
            if cuda_graph_bs:
                # As upstream, only sizes that can run together are captured; the rest are logged.
                buckets = sorted({b for b in cuda_graph_bs if b <= max_running_requests})
                dropped = sorted(set(cuda_graph_bs) - set(buckets))
                if dropped:
                    logger.warning("--cuda-graph-bs: %s above the %d requests that can run together: not captured",
                                   dropped, max_running_requests)  # fmt: skip
            if buckets is None or buckets:
                self.graphs = CudaGraphRunner(self, min(cuda_graph_max_bs, max_running_requests), buckets=buckets)

    def _attach(self, batch: ForwardBatch) -> ForwardBatch:
        batch.attn_backend = self.attn_backend
        batch.sconv_pool = self.sconv_pool
        batch.reset_extend_starts()  # computed afresh inside each forward (a graph capture's own, too)
        self.attn_backend.init_forward_metadata(batch)
        return batch

    def forward(self, batch: ForwardBatch) -> ModelOutput:
        with model_step():
            self.faults.tick()
            if self.graphs is not None and self.graphs.can_run(batch):
                return self.graphs.replay(batch)
            return self.forward_eager(batch)

    def decode_batch(self, input_ids: torch.Tensor | list[list[int]], rows: list[int], prefix_lens: list[int],
                     out_loc: list[int], out_loc_swa: list[int]) -> ForwardBatch:  # fmt: skip
        """A decode batch of one token per sequence: staged into the CUDA graphs' inputs where a graph
        holds it, else built as any batch."""
        if self.graphs is not None:
            staged = self.graphs.stage_decode(input_ids, rows, prefix_lens, out_loc, out_loc_swa)
            if staged is not None:
                return staged
        return ForwardBatch.build(ForwardMode.DECODE, input_ids, rows, prefix_lens, out_loc, out_loc_swa, self.device)

    def forward_eager(self, batch: ForwardBatch) -> ModelOutput:
        return self.model(self._attach(batch))

    def forward_mtp(self, depth: int, prev_hidden: torch.Tensor, batch: ForwardBatch) -> ModelOutput:
        with model_step():
            return self.model.forward_mtp(depth, prev_hidden, self._attach(batch))
