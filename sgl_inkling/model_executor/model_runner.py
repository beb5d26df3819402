"""Owns the model, its memory pools and attention backend; runs one ForwardBatch at a time."""

from __future__ import annotations

from collections.abc import Callable

import torch

from sgl_inkling.layers.attention.base import AttentionBackend
from sgl_inkling.layers.attention.torch_native import TorchNativeBackend
from sgl_inkling.mem_cache.memory_pool import KVLayout, KVPool, ReqToTokenPool, SConvStatePool
from sgl_inkling.model_executor.forward_batch import ForwardBatch
from sgl_inkling.models.inkling.model import InklingForCausalLM, ModelOutput


def _triton_backend(*args) -> AttentionBackend:
    # Imported on use: the Triton kernels (and Triton itself) are optional on CPU-only installs.
    from sgl_inkling.layers.attention.triton_backend import TritonBackend

    return TritonBackend(*args)


ATTENTION_BACKENDS: dict[str, Callable[..., AttentionBackend]] = {
    "torch_native": TorchNativeBackend,
    "triton": _triton_backend,
}


class ModelRunner:
    def __init__(
        self,
        model: InklingForCausalLM,
        max_running_requests: int,
        max_context_len: int,
        max_total_tokens: int,
        max_swa_tokens: int | None = None,
        attention_backend: str = "torch_native",
    ):
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
            KVLayout(cfg.num_key_value_heads, cfg.head_dim),
            self.dtype,
            self.device,
        )
        self.swa_pool = KVPool(
            max_swa_tokens or max_total_tokens,
            swa_ids,
            KVLayout(cfg.swa_num_key_value_heads, cfg.swa_head_dim),
            self.dtype,
            self.device,
        )
        channels = {
            a.spec.layer_id: (
                a.spec.num_kv_heads * a.spec.head_dim,
                a.spec.num_kv_heads * a.spec.head_dim,
                cfg.hidden_size,
                cfg.hidden_size,
            )
            for a in layers
        }
        self.sconv_pool = SConvStatePool(max_running_requests, channels, cfg.conv_kernel_size, self.device)
        self.attn_backend = ATTENTION_BACKENDS[attention_backend](
            self.req_to_token, self.full_pool, self.swa_pool
        )

    def _attach(self, batch: ForwardBatch) -> ForwardBatch:
        batch.attn_backend = self.attn_backend
        batch.sconv_pool = self.sconv_pool
        self.attn_backend.init_forward_metadata(batch)
        return batch

    def forward(self, batch: ForwardBatch) -> ModelOutput:
        return self.model(self._attach(batch))

    def forward_mtp(self, depth: int, prev_hidden: torch.Tensor, batch: ForwardBatch) -> ModelOutput:
        return self.model.forward_mtp(depth, prev_hidden, self._attach(batch))
