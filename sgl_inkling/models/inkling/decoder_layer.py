"""One Inkling decoder layer: attention and FFN, each followed by a short conv before the residual."""

from __future__ import annotations

import torch
from torch import nn

from sgl_inkling.mem_cache.memory_pool import SCONV_ATTN, SCONV_MLP
from sgl_inkling.model_executor.forward_batch import ForwardBatch
from sgl_inkling.models.inkling.attention import InklingAttention
from sgl_inkling.models.inkling.config import SPARSE, InklingTextConfig
from sgl_inkling.models.inkling.moe import DenseMLP, MoE
from sgl_inkling.models.inkling.norm import RMSNorm
from sgl_inkling.models.inkling.sconv import ShortConv
from sgl_inkling_kernels._triton import use_triton
from sgl_inkling_kernels.rmsnorm import fused_add_rmsnorm


class DecoderLayer(nn.Module):
    def __init__(self, cfg: InklingTextConfig, layer_id: int, sliding: bool, mlp_type: str):
        super().__init__()
        h = cfg.hidden_size
        self.attn_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.attn = InklingAttention(cfg, layer_id, sliding)
        self.attn_sconv = ShortConv(h, cfg.conv_kernel_size, layer_id, SCONV_ATTN)
        self.mlp_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if mlp_type == SPARSE else DenseMLP(h, cfg.intermediate_size)
        self.mlp_sconv = ShortConv(h, cfg.conv_kernel_size, layer_id, SCONV_MLP)

    def forward(self, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        a = self.attn_sconv(self.attn(self.attn_norm(h), batch), batch)
        if use_triton(h):
            m_in, h = fused_add_rmsnorm(a, h, self.mlp_norm.weight, self.mlp_norm.eps)
        else:
            h = h + a
            m_in = self.mlp_norm(h)
        return h + self.mlp_sconv(self.mlp(m_in), batch)
