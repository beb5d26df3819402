"""The Inkling text model (trunk + MTP depths) over the runtime's ragged batches and paged caches.

Module names mirror the hub tensor names (`model.llm.*`, `model.mtp.*`, and with multimodal input
`model.visual.*`, `model.audio.*`), so loading is by name.
Pool layer ids: trunk layer i is i; MTP depth d is num_hidden_layers + d.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sgl_inkling.layers.linear import Linear, linear
from sgl_inkling.model_executor.forward_batch import ForwardBatch
from sgl_inkling.models.inkling.audio import InklingAudio
from sgl_inkling.models.inkling.config import SLIDING, InklingConfig, InklingTextConfig
from sgl_inkling.models.inkling.decoder_layer import DecoderLayer
from sgl_inkling.models.inkling.mtp import MTP
from sgl_inkling.models.inkling.norm import RMSNorm
from sgl_inkling.models.inkling.vision import InklingVision


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [N, unpadded_vocab] fp32, at batch.logits_indices
    hidden: torch.Tensor  # [T, H] final-normed hidden of every new token (MTP depth 0 input)


class InklingLLM(nn.Module):
    def __init__(self, cfg: InklingTextConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, cfg.layer_types[i] == SLIDING, cfg.mlp_layer_types[i])
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.unembed = Linear(cfg.hidden_size, cfg.vocab_size)

    def run_layers(self, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """The final-normed hidden state after every layer. Each layer hands the next its attn_norm
        (the last, the final norm) where it computed that in its own last launch."""
        normed = None
        for i, layer in enumerate(self.layers):
            following = self.layers[i + 1].attn_norm if i + 1 < len(self.layers) else self.norm
            h, normed = layer(h, batch, normed, following)
        return self.norm(h) if normed is None else normed


class InklingModel(nn.Module):
    def __init__(self, config: InklingConfig, modalities: tuple[str, ...]):
        super().__init__()
        cfg = config.text
        self.llm = InklingLLM(cfg)
        self.mtp = MTP(cfg) if cfg.mtp is not None else None
        if "image" in modalities:
            self.visual = InklingVision(config.vision, cfg.hidden_size)
        if "audio" in modalities:
            self.audio = InklingAudio(config.audio, cfg.hidden_size)


class InklingForCausalLM(nn.Module):
    def __init__(self, config: InklingConfig, modalities: tuple[str, ...] = ()):
        """`modalities`: the media towers to build ("image", "audio"); none for a text-only model."""
        super().__init__()
        self.config = config
        self.cfg = config.text
        self.modalities = tuple(modalities)
        self.model = InklingModel(config, self.modalities)
        self.draft_vocab: torch.Tensor | None = None  # MTP draft vocabulary (set_draft_vocab)
        self.draft_head: torch.Tensor | None = None

    @property
    def num_mtp_layers(self) -> int:
        return self.cfg.mtp.num_layers if self.cfg.mtp is not None else 0

    def decoder_layers(self) -> list[DecoderLayer]:
        """Every decoder layer, trunk first, then the MTP depths' blocks."""
        blocks = list(self.model.llm.layers)
        if self.model.mtp is not None:
            blocks += [m.transformer_block for m in self.model.mtp.layers]
        return blocks

    def attention_layers(self) -> list:
        """Every attention module, trunk first, with its pool layer id in `.spec`."""
        return [b.attn for b in self.decoder_layers()]

    def pack_weights(self) -> None:
        """Lay weights out for the fused kernels (once, on the materialised model, before loading)."""
        for attn in self.attention_layers():
            attn.pack_projections()

    def sconv_channels(self) -> dict[int, tuple[int, ...]]:
        """Per pool layer id, the channels this rank's four short convs hold (shards under TP)."""
        return {b.attn.spec.layer_id: tuple(c.weight.shape[0] for c in b.sconvs()) for b in self.decoder_layers()}

    def logits(self, normed_hidden: torch.Tensor) -> torch.Tensor:
        """LM head on final-normed hidden states: divide by the muP width multiplier, slice the padding."""
        h = normed_hidden / self.cfg.logits_mup_width_multiplier
        return self.model.llm.unembed(h).float()[:, : self.cfg.unpadded_vocab_size]

    def set_draft_vocab(self, token_ids: torch.Tensor | None) -> None:
        """MTP depths compute logits over these token ids only (a draft vocabulary; None: all). The
        rows of the LM head are copied once, so a draft logit costs [len(ids), H], not [V, H]."""
        if token_ids is None:
            self.draft_vocab = self.draft_head = None
            return
        weight = self.model.llm.unembed.weight
        self.draft_vocab = token_ids.to(device=weight.device, dtype=torch.int64)
        self.draft_head = weight.detach()[self.draft_vocab].contiguous()

    def draft_logits(self, normed_hidden: torch.Tensor) -> torch.Tensor:
        """An MTP depth's logits: over the draft vocabulary when one is set ([N, len(draft_vocab)],
        column j is token draft_vocab[j]), else the full LM head's."""
        if self.draft_head is None:
            return self.logits(normed_hidden)
        h = normed_hidden / self.cfg.logits_mup_width_multiplier
        return linear(h, self.draft_head).float()

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        llm = self.model.llm
        return llm.embed_norm(llm.embed(input_ids))

    @torch.no_grad()
    def encode_media(self, kind: str, data: torch.Tensor) -> torch.Tensor:
        """Tower output, one row per placeholder token: "image" pixels [N, T, P, P, C] or "audio"
        dMel bins [T, 80]."""
        tower = self.model.visual if kind == "image" else self.model.audio
        return tower(data)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch) -> ModelOutput:
        llm = self.model.llm
        if batch.input_embeds is not None:
            h = batch.input_embeds
        else:
            h = self.embed_tokens(batch.input_ids)
        h = llm.run_layers(h, batch)
        return ModelOutput(logits=self.logits(h[batch.logits_indices]), hidden=h)

    @torch.no_grad()
    def forward_mtp(self, depth: int, prev_hidden: torch.Tensor, batch: ForwardBatch) -> ModelOutput:
        """One MTP depth. Token t of the batch pairs the previous depth's hidden at t with
        `batch.input_ids[t]`, the token that follows t; positions are those of the hidden states."""
        h = self.model.mtp.layers[depth](prev_hidden, self.model.llm.embed(batch.input_ids), batch)
        if self.model.mtp.chain_norm is not None:
            h = self.model.mtp.chain_norm(h)
        logits = self.draft_logits(self.model.llm.norm(h[batch.logits_indices]))
        return ModelOutput(logits=logits, hidden=h)
