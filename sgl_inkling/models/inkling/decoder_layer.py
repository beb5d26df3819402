"""One Inkling decoder layer: attention and FFN, each followed by a short conv before the residual.

Under TP the attention and FFN outputs are partial sums: reduce-scatter them over the hidden
dimension, run the output conv on this rank's channels only, then all-gather (see collectives).
"""

from __future__ import annotations

import torch
from torch import nn

from sgl_inkling.distributed.collectives import all_gather_hidden, reduce_scatter_hidden
from sgl_inkling.distributed.parallel_state import get_parallel
from sgl_inkling.distributed.sharding import declare, local, split
from sgl_inkling.mem_cache.memory_pool import SCONV_ATTN, SCONV_MLP
from sgl_inkling.model_executor.forward_batch import ForwardBatch
from sgl_inkling.models.inkling.attention import InklingAttention
from sgl_inkling.models.inkling.config import SPARSE, InklingTextConfig
from sgl_inkling.models.inkling.moe import DenseMLP, MoE
from sgl_inkling.models.inkling.norm import RMSNorm
from sgl_inkling.models.inkling.sconv import ShortConv, capture_window
from sgl_inkling_kernels._triton import fused_decode, use_triton
from sgl_inkling_kernels.rmsnorm import fused_add_rmsnorm
from sgl_inkling_kernels.sconv_norm import (
    sconv_add_decode,
    sconv_add_rmsnorm_decode,
    sconv_add_rmsnorm_extend,
)

# Up to this many tokens a MoE's slots are summed in the FFN output conv's launch (one launch fewer a
# layer: 2 us a layer at batch 1 and 8 at batch 8 on the H100); at batch 64 the conv's programs, each
# loading every slot of its channels, took 30 us a layer longer than the separate sum (732c969).
SLOT_SUM_IN_CONV_MAX_TOKENS = 8


class DecoderLayer(nn.Module):
    def __init__(self, cfg: InklingTextConfig, layer_id: int, sliding: bool, mlp_type: str):
        super().__init__()
        h = cfg.hidden_size
        channels = split(h, get_parallel(), "hidden size")
        self.attn_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.attn = InklingAttention(cfg, layer_id, sliding)
        self.attn_sconv = ShortConv(local(h, channels), cfg.conv_kernel_size, layer_id, SCONV_ATTN)
        self.mlp_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if mlp_type == SPARSE else DenseMLP(h, cfg.intermediate_size)
        self.mlp_sconv = ShortConv(local(h, channels), cfg.conv_kernel_size, layer_id, SCONV_MLP)
        declare(self.attn_sconv, "weight", channels)
        declare(self.mlp_sconv, "weight", channels)

    def sconvs(self) -> tuple[ShortConv, ...]:
        """The four convs in pool stream order (SCONV_K, SCONV_V, SCONV_ATTN, SCONV_MLP)."""
        return self.attn.k_sconv, self.attn.v_sconv, self.attn_sconv, self.mlp_sconv

    def _fused(self, batch: ForwardBatch) -> str | None:
        """At TP 1 each output conv is fused with the residual add (and the next norm), in the form
        ForwardBatch.fused_form picks; None: the modules (that form's None, and TP, where the conv
        runs on a reduce-scattered shard)."""
        if not fused_decode() or get_parallel().tp_size != 1:
            return None
        return batch.fused_form(self.attn.spec.layer_id)

    def _conv_add(self, kind: str, x, conv: ShortConv, residual: torch.Tensor, norm: RMSNorm | None, batch):
        """(norm(residual + conv(x)) or None, residual + conv(x)) through the fused kernel of `kind`."""
        lid = self.attn.spec.layer_id
        state, rows = batch.sconv_pool.state(lid, conv.stream), batch.req_pool_indices
        w, eps = (norm.weight, norm.eps) if norm is not None else (None, 0.0)
        if kind == "decode":
            if norm is None:
                return None, sconv_add_decode(x, conv.weight, state, rows, residual)
            return sconv_add_rmsnorm_decode(x, conv.weight, state, rows, residual, w, eps)
        return sconv_add_rmsnorm_extend(
            x, conv.weight, state, rows, batch.prefix_lens, batch.extend_lens, batch.extend_starts(), residual,
            w, eps, capture=capture_window(batch, lid, conv.stream, state.shape[1]),
        )  # fmt: skip

    def forward(
        self,
        h: torch.Tensor,
        batch: ForwardBatch,
        normed: torch.Tensor | None = None,
        next_norm: RMSNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(hidden state out, next_norm of it or None). normed: this layer's attn_norm(h) where the layer
        before computed it; next_norm: the norm that follows (the next layer's attn_norm, or the final
        norm), computed in this layer's last launch where a fused path runs (a launch fewer
        a layer), else left to the caller (None)."""
        a = self.attn(self.attn_norm(h) if normed is None else normed, batch)
        fused = self._fused(batch) if use_triton(h) else None
        if fused is not None:
            m_in, h = self._conv_add(fused, a, self.attn_sconv, h, self.mlp_norm, batch)
            defer = isinstance(self.mlp, MoE) and m_in.shape[0] <= SLOT_SUM_IN_CONV_MAX_TOKENS
            m = self.mlp(m_in, defer_slot_sum=True) if defer else self.mlp(m_in)
            out_normed, h = self._conv_add(fused, m, self.mlp_sconv, h, next_norm, batch)
            return h, out_normed
        a = all_gather_hidden(self.attn_sconv(reduce_scatter_hidden(a), batch))
        if use_triton(h):
            m_in, h = fused_add_rmsnorm(a, h, self.mlp_norm.weight, self.mlp_norm.eps)
        else:
            h = h + a
            m_in = self.mlp_norm(h)
        m = all_gather_hidden(self.mlp_sconv(reduce_scatter_hidden(self.mlp(m_in)), batch))
        return h + m, None
