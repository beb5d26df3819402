"""MTP depths: z = input_proj(concat(norm(g), norm(e))) through one dense decoder layer.

The trunk's embedding table is shared; we feed the raw table row (before the trunk's embed_norm)
to each depth's own `embed_norm`. The transformers port has no MTP, so this is the eager reference.
"""

from __future__ import annotations

import torch
from torch import nn

from sgl_inkling.layers.linear import Linear
from sgl_inkling.model_executor.forward_batch import ForwardBatch
from sgl_inkling.models.inkling.config import DENSE, SLIDING, InklingTextConfig
from sgl_inkling.models.inkling.decoder_layer import DecoderLayer
from sgl_inkling.models.inkling.norm import RMSNorm


class MTPLayer(nn.Module):
    def __init__(self, cfg: InklingTextConfig, depth: int):
        super().__init__()
        h = cfg.hidden_size
        self.hidden_first = cfg.mtp.hidden_states_first
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.embed_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.input_proj = Linear(2 * h, h)
        sliding = cfg.mtp.layer_types[depth] == SLIDING
        self.transformer_block = DecoderLayer(cfg, cfg.num_hidden_layers + depth, sliding, DENSE)

    def forward(self, prev_hidden: torch.Tensor, embeds: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        g, e = self.hidden_norm(prev_hidden), self.embed_norm(embeds)
        z = self.input_proj(torch.cat([g, e] if self.hidden_first else [e, g], dim=-1))
        return self.transformer_block(z, batch)[0]


class MTP(nn.Module):
    def __init__(self, cfg: InklingTextConfig):
        super().__init__()
        self.layers = nn.ModuleList(MTPLayer(cfg, d) for d in range(cfg.mtp.num_layers))
        self.chain_norm = (
            RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if cfg.mtp.chain_hidden_post_norm else None
        )

    def quantize_fp8(self) -> int:
        """--speculative-draft-model-quantization fp8: each depth's input projection and dense MLP (about
        80% of a depth's bytes at Inkling's width) as fp8 codes with row scales (Linear.quantize_fp8);
        attention and norms stay in the model's dtype. Drafts change, the trunk verifies: outputs do
        not. Returns the bytes saved."""
        saved = 0
        for layer in self.layers:
            mlp = layer.transformer_block.mlp
            for lin in (layer.input_proj, mlp.w13_dn, mlp.w2_md):
                before = lin.weight.nbytes
                lin.quantize_fp8()
                saved += before - lin.weight.nbytes - lin.weight_scale.nbytes
        return saved
