"""The model's non-attention hot spots routed through the Triton kernels, applied from outside.

A stand-in until the model files call the kernels themselves (the same calls, listed in the issue-7
report): RMSNorm, the residual add + RMSNorm between attention and FFN, the four short convs, the
router and the routed + shared experts. With these and the `triton` attention backend a decode step
has no host synchronisation, so it can be captured in a CUDA graph. Used by bench_one_batch
(`--fast-path kernels`) and by tests; `force=True` runs the kernels on CPU tensors too (Triton's
interpreter), for testing only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from sgl_inkling.layers.linear import linear
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.models.inkling.decoder_layer import DecoderLayer
from sgl_inkling.models.inkling.moe import MoE
from sgl_inkling.models.inkling.norm import RMSNorm
from sgl_inkling.models.inkling.sconv import ShortConv
from sgl_inkling_kernels.fused_moe import fused_moe
from sgl_inkling_kernels.rmsnorm import fused_add_rmsnorm, rmsnorm
from sgl_inkling_kernels.router import route
from sgl_inkling_kernels.sconv import sconv_decode, sconv_extend


def _rmsnorm_forward(self: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    return rmsnorm(x, self.weight, self.eps)


def _sconv_forward(self: ShortConv, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    state = batch.sconv_pool.state(self.layer_id, self.stream)
    if batch.mode is ForwardMode.DECODE:
        return sconv_decode(x, self.weight, state, batch.req_pool_indices)
    return sconv_extend(x, self.weight, state, batch.req_pool_indices, batch.prefix_lens, batch.extend_lens)


def _moe_forward(self: MoE, x: torch.Tensor) -> torch.Tensor:
    gate, experts, shared = self.gate, self.experts, self.shared_experts
    logits = linear(x.float(), gate.weight.float())
    ids, weights, gammas = route(logits, gate.bias, gate.global_scale, gate.top_k, gate.route_scale, x.dtype)
    return fused_moe(x, experts.w13_weight, experts.w2_weight, ids, weights,
                     shared.shared_w13_weight, shared.shared_w2_weight, gammas)  # fmt: skip


def _layer_forward(self: DecoderLayer, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    a = self.attn_sconv(self.attn(self.attn_norm(h), batch), batch)
    m_in, h = fused_add_rmsnorm(a, h, self.mlp_norm.weight, self.mlp_norm.eps)
    return h + self.mlp_sconv(self.mlp(m_in), batch)


_PATCHES = [
    (RMSNorm, _rmsnorm_forward),
    (ShortConv, _sconv_forward),
    (MoE, _moe_forward),
    (DecoderLayer, _layer_forward),
]


@contextlib.contextmanager
def fast_path(force: bool = False) -> Iterator[None]:
    """Within the block, the patched modules use the kernels for CUDA tensors (any tensor if force)."""
    saved = [(cls, cls.forward) for cls, _ in _PATCHES]

    def dispatch(new, old):
        def forward(self, x, *rest):
            return new(self, x, *rest) if (force or x.is_cuda) else old(self, x, *rest)

        return forward

    for cls, new in _PATCHES:
        cls.forward = dispatch(new, cls.forward)
    try:
        yield
    finally:
        for cls, old in saved:
            cls.forward = old
