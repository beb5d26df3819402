"""The attention backend interface: stores a layer's new KV in the pools and attends over the cache."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from sgl_inkling.mem_cache.memory_pool import KVPool, ReqToTokenPool
from sgl_inkling.model_executor.forward_batch import ForwardBatch


@dataclass(frozen=True)
class AttnLayerSpec:
    """Static facts about one attention layer that a backend needs."""

    layer_id: int  # id in the KV pools (trunk layers first, then MTP depths)
    sliding: bool
    num_heads: int
    num_kv_heads: int
    head_dim: int
    window: int | None  # keys with 0 <= t - s < window are visible; None = unlimited
    rel_extent: int  # relative bias is zero for t - s >= rel_extent
    scaling: float


class AttentionBackend(ABC):
    """Paged attention with Inkling's relative bias, window and log scaling."""

    def __init__(self, req_to_token: ReqToTokenPool, full_pool: KVPool, swa_pool: KVPool | None):
        self.req_to_token = req_to_token
        self.full_pool = full_pool
        self.swa_pool = swa_pool

    def kv_destination(self, spec: AttnLayerSpec, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k_buf, v_buf, slots [T]): where this batch's new keys and values of the layer go."""
        pool, _ = self.pool_of(spec)
        k_buf, v_buf = pool.buffers(spec.layer_id)
        return k_buf, v_buf, batch.out_loc_swa if spec.sliding else batch.out_loc

    def pool_of(self, spec: AttnLayerSpec, table_offset: int = 0) -> tuple[KVPool, torch.Tensor]:
        """The KV pool and req-to-token table (shifted by `table_offset` columns) of this layer."""
        pool, table = (self.swa_pool, self.req_to_token.swa) if spec.sliding else (self.full_pool, self.req_to_token.full)
        return pool, table[:, table_offset:] if table_offset else table

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Precompute per-batch index tensors once, before the layers run (none needed by default)."""
        return None

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, heads, head_dim], log scaling already applied
        # [T, kv_heads, head_dim] keys / values of the new tokens, stored by the backend; None when
        # the caller already wrote them into the pool at the batch's out_loc (the fused decode epilogue)
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        rel: torch.Tensor,  # [T, heads, d_rel] per-token relative states r = W_r h
        rel_table: torch.Tensor,  # [d_rel, rel_extent] the layer's bias-vs-distance profiles
        tau: torch.Tensor | None,  # [T] log-scaling factor of each query (also scales the bias)
        spec: AttnLayerSpec,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Return the attention output [T, heads * head_dim] in q's dtype."""
