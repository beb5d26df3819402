"""Inkling attention: q/k/v/r projections, K and V short convs, per-head q/k RMSNorm, relative bias."""

from __future__ import annotations

import torch
from torch import nn

from sgl_inkling.distributed.parallel_state import get_parallel
from sgl_inkling.distributed.sharding import declare, local, on_dim, split, split_kv_heads
from sgl_inkling.layers.attention.base import AttnLayerSpec
from sgl_inkling.layers.linear import Linear, decode_linear
from sgl_inkling.mem_cache.memory_pool import SCONV_K, SCONV_V
from sgl_inkling.model_executor.forward_batch import ForwardBatch
from sgl_inkling.models.inkling.config import InklingTextConfig
from sgl_inkling.models.inkling.norm import RMSNorm
from sgl_inkling.models.inkling.sconv import ShortConv, capture_window
from sgl_inkling_kernels._triton import fused_decode, use_triton
from sgl_inkling_kernels.dense_gemv import applies
from sgl_inkling_kernels.qkvr_epilogue import qkvr_decode_epilogue, qkvr_extend_epilogue


class RelLogitsProj(nn.Module):
    """The per-layer table P[d_rel, extent] of bias-vs-distance profiles."""

    def __init__(self, d_rel: int, extent: int):
        super().__init__()
        self.proj = nn.Parameter(torch.zeros(d_rel, extent))


class InklingAttention(nn.Module):
    """Under TP each rank holds a contiguous block of query heads and the KV heads they read; the
    output projection then yields partial sums that the decoder layer reduces."""

    def __init__(self, cfg: InklingTextConfig, layer_id: int, sliding: bool):
        super().__init__()
        nh, nkv, hd = cfg.attn_shape(sliding)
        h = cfg.hidden_size
        heads, kv = split(nh, get_parallel(), "attention heads"), split_kv_heads(nkv, get_parallel())
        nh, nkv = local(nh, heads), local(nkv, kv)
        self.spec = AttnLayerSpec(
            layer_id=layer_id,
            sliding=sliding,
            num_heads=nh,
            num_kv_heads=nkv,
            head_dim=hd,
            window=cfg.sliding_window_size if sliding else None,
            rel_extent=cfg.rel_extent_of(sliding),
            scaling=1.0 / hd,  # q and k are RMS-normalised per head, hence 1/d, not 1/sqrt(d)
        )
        self.d_rel = cfg.d_rel
        self.log_scaling = None if sliding else cfg.log_scaling_n_floor
        self.log_alpha = cfg.log_scaling_alpha
        self.wq_du = Linear(h, nh * hd)
        self.wk_dv = Linear(h, nkv * hd)
        self.wv_dv = Linear(h, nkv * hd)
        self.wr_du = Linear(h, nh * cfg.d_rel)
        self.wo_ud = Linear(nh * hd, h)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.rel_logits_proj = RelLogitsProj(cfg.d_rel, self.spec.rel_extent)
        self.k_sconv = ShortConv(nkv * hd, cfg.conv_kernel_size, layer_id, SCONV_K)
        self.v_sconv = ShortConv(nkv * hd, cfg.conv_kernel_size, layer_id, SCONV_V)
        for mod in (self.wq_du, self.wr_du):
            declare(mod, "weight", heads)
        for mod in (self.wk_dv, self.wv_dv, self.k_sconv, self.v_sconv):
            declare(mod, "weight", kv)
        declare(self.wo_ud, "weight", on_dim(heads, 1))
        self.wqkvr: torch.Tensor | None = None

    def pack_projections(self) -> None:
        """Make the q/k/v/r weights row blocks of one [rows, H] tensor, so a decode step reads them in
        one GEMM. Called once on the materialised model, before loading: the loader and dummy init
        copy into the four parameters (same names and shapes), which are views of `wqkvr`."""
        mods = (self.wq_du, self.wk_dv, self.wv_dv, self.wr_du)
        packed = torch.cat([m.weight.detach() for m in mods])
        start = 0
        for m in mods:
            n = m.weight.shape[0]
            m.weight = nn.Parameter(packed[start : start + n], requires_grad=m.weight.requires_grad)
            start += n
        self.wqkvr = packed  # a plain attribute: not a parameter, so no loader ever sees it

    def _epilogue(self, batch: ForwardBatch) -> str | None:
        """Which packed-GEMM epilogue serves the batch (ForwardBatch.fused_form); None: the per-stream
        modules (and always without the packed weight)."""
        if self.wqkvr is None or not fused_decode():
            return None
        return batch.fused_form(self.spec.layer_id)

    def project(self, x: torch.Tensor, batch: ForwardBatch, kv_cache=None) -> tuple[torch.Tensor | None, ...]:
        """(q normed, k convolved and normed, v convolved, rel), each [T, heads, dim]. On the fused
        paths, given `kv_cache` (the backend's kv_destination), k and v go straight into the cache
        and come back None."""
        s = self.spec
        t = x.shape[0]
        epilogue = self._epilogue(batch) if use_triton(x) else None
        if epilogue is not None:
            k_state, v_state = (batch.sconv_pool.state(s.layer_id, stream) for stream in (SCONV_K, SCONV_V))
            args = (
                decode_linear(x, self.wqkvr), s.num_heads, s.num_kv_heads, s.head_dim,
                self.q_norm.weight, self.k_norm.weight, self.k_sconv.weight, self.v_sconv.weight,
                k_state, v_state, batch.req_pool_indices,
            )  # fmt: skip
            if epilogue == "decode":
                return qkvr_decode_epilogue(*args, self.q_norm.eps, kv_cache=kv_cache)
            width = k_state.shape[1]
            windows = [capture_window(batch, s.layer_id, stream, width) for stream in (SCONV_K, SCONV_V)]
            return qkvr_extend_epilogue(
                *args, batch.prefix_lens, batch.extend_lens, batch.extend_starts(), self.q_norm.eps,
                kv_cache=kv_cache, capture=tuple(windows) if windows[0] is not None else None,
            )  # fmt: skip
        xq, xk, xv, xr = self._projections(x)
        q = self.q_norm(xq.reshape(t, s.num_heads, s.head_dim))
        k = self.k_norm(self.k_sconv(xk, batch).view(t, s.num_kv_heads, s.head_dim))
        v = self.v_sconv(xv, batch).view(t, s.num_kv_heads, s.head_dim)
        rel = xr.reshape(t, s.num_heads, self.d_rel)
        return q, k, v, rel

    def _projections(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x's q/k/v/r projections ([T, rows] each). A short extend on the GPU (an MTP verify or draft
        depth, a few-token prompt) reads the packed weights in one GEMV as decode does, not in four
        cuBLAS GEMMs. The four come back as column slices of one output: the conv kernels and the
        attention kernels take row strides, and the q norm copies its rows out first."""
        mods = (self.wq_du, self.wk_dv, self.wv_dv, self.wr_du)
        if self.wqkvr is None or not use_triton(x) or not applies(x, self.wqkvr):
            return tuple(m(x) for m in mods)
        return decode_linear(x, self.wqkvr).split([m.weight.shape[0] for m in mods], dim=1)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        s = self.spec
        fused = use_triton(x) and self._epilogue(batch) is not None
        q, k, v, rel = self.project(x, batch, batch.attn_backend.kv_destination(s, batch) if fused else None)
        tau = None
        if self.log_scaling is not None:
            # Long-context query scaling of full layers; the bias is scaled by the same factor.
            # The same for every full layer of the forward: computed once (seven launches a layer).
            key = ("log_scaling_tau", self.log_scaling, self.log_alpha)
            tau = batch.once(key, lambda: log_scaling_tau(batch.positions, self.log_scaling, self.log_alpha))
            q = (q.float() * tau[:, None, None]).to(q.dtype)
        o = batch.attn_backend.forward(q, k, v, rel, self.rel_logits_proj.proj, tau, s, batch)
        return decode_linear(o, self.wo_ud.weight) if use_triton(o) else self.wo_ud(o)


def log_scaling_tau(positions: torch.Tensor, n_floor: int, alpha: float) -> torch.Tensor:
    """tau_t = 1 + alpha * log(max(1, (pos_t + 1) / n_floor))."""
    return 1.0 + alpha * torch.log(((positions + 1).float() / n_floor).clamp(min=1.0))
