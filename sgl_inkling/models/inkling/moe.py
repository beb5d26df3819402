"""Feed-forward blocks: the dense SwiGLU MLP and the MoE with expert sinks (reference torch path).

Checkpoint layout keeps gate/up rows interleaved (row 2i gate, 2i+1 up); we split on the fly.
Under TP every rank sees every token: the dense MLP and the shared experts split their intermediate
dimension over the ranks; routed experts split into `ep_size` sets (a rank computes only the
selected experts of its set), each set's intermediate split over the ranks that share it. Every
output is then a partial sum, reduced by the decoder layer. The router is replicated.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from sgl_inkling.distributed.parallel_state import get_parallel
from sgl_inkling.distributed.sharding import Shard, declare, local, split
from sgl_inkling.layers.linear import Linear, linear
from sgl_inkling.models.inkling.config import InklingTextConfig
from sgl_inkling.models.inkling.quant_config import NVFP4
from sgl_inkling_kernels._triton import fused_decode, use_triton
from sgl_inkling_kernels.fused_moe import SMALL_ALIGN_PAIRS, default_block_m, fused_moe
from sgl_inkling_kernels.moe_slots import UnsummedSlots
from sgl_inkling_kernels.nvfp4 import BLOCK, dequantize_nvfp4
from sgl_inkling_kernels.nvfp4_layout import to_checkpoint_layout, to_mma_layout
from sgl_inkling_kernels.router import route, route_decode, route_decode_aligned

logger = logging.getLogger(__name__)
FP8 = torch.float8_e4m3fn
# Up to this many tokens (small decode batches, MTP verify at batch 1) the router's fp32 GEMM runs
# split-K in our GEMV kernel, which reads x in its dtype; it re-reads the weights per token, so more
# tokens (larger batches, prefill) go to cuBLAS on an fp32 copy.
FUSED_ROUTER_MAX_TOKENS = 16
# Up to this many tokens the routing launch also lays out the experts' (token, slot) pairs
# (route_decode_aligned): a launch fewer at batch 1, where it saves 2.3 us a layer on the H200; its
# one program routes token after token, which is slower from two tokens on (route_aligned).
ALIGNED_ROUTER_MAX_TOKENS = 1


def swiglu_interleaved(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    gu = linear(x, w13).unflatten(-1, (-1, 2))
    return linear(F.silu(gu[..., 0]) * gu[..., 1], w2)


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        inter = split(intermediate, get_parallel(), "MLP intermediate size")
        intermediate = local(intermediate, inter)
        self.w13_dn = Linear(hidden, 2 * intermediate)
        self.w2_md = Linear(intermediate, hidden)
        self.global_scale = nn.Parameter(torch.ones(1))
        declare(self.w13_dn, "weight", inter)  # a contiguous block of (gate, up) row pairs
        declare(self.w2_md, "weight", Shard(1, inter.part, inter.parts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # swiglu_interleaved through the modules: an MTP depth's may hold fp8 codes (Linear.quantize_fp8).
        gu = self.w13_dn(x).unflatten(-1, (-1, 2))
        return self.w2_md(F.silu(gu[..., 0]) * gu[..., 1]) * self.global_scale


class Router(nn.Module):
    """Sigmoid router over routed + shared ("sink") experts, in fp32."""

    def __init__(self, cfg: InklingTextConfig):
        super().__init__()
        self.n_routed = cfg.n_routed_experts
        self.top_k = cfg.num_experts_per_tok
        self.route_scale = cfg.route_scale
        # Held in fp32 (exact for a bf16 checkpoint): routing runs in fp32, and converting the weight
        # on every call cost a copy kernel per layer per decode step.
        n = cfg.n_routed_experts + cfg.n_shared_experts
        self.weight = nn.Parameter(torch.zeros(n, cfg.hidden_size, dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        self.global_scale = nn.Parameter(torch.ones(1, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (top-k expert ids [T, k], their weights [T, k], shared-expert weights [T, S])."""
        logits = linear(x.float(), self.weight.float())
        routed = logits[:, : self.n_routed]
        # The bias steers selection only; weights come from the raw logits.
        ids = torch.topk(routed.sigmoid() + self.bias.float(), self.top_k, dim=-1, sorted=False).indices
        chosen = torch.cat([routed.gather(-1, ids), logits[:, self.n_routed :]], dim=-1)
        # sigmoid(l_a) / sum sigmoid(l_a'), as a softmax of log-sigmoids: shared experts soak up mass.
        weights = torch.softmax(F.logsigmoid(chosen), dim=-1) * (self.route_scale * self.global_scale.float())
        weights = weights.to(x.dtype)
        return ids, weights[:, : self.top_k], weights[:, self.top_k :]


class RoutedExperts(nn.Module):
    """This rank's routed experts, held in the checkpoint's layout: `[E_loc, 2I_loc, H]` and
    `[E_loc, H, I_loc]` in the activations' dtype, or NVFP4 (`cfg.expert_quant == "nvfp4"`): uint8
    codes with the last dim halved, fp8 block scales with it divided by 16, one fp32 scale2 per
    expert (`w13_weight_scale`, `w13_weight_scale2`, ...; layout in sgl_inkling_kernels/nvfp4.py).
    After loading, on a GPU the CUDA decode kernels serve, the codes' bits are rearranged inside each
    word (`code_layout` "mma", use_kernel_layout); shapes and shards stay the checkpoint's."""

    code_layout = "checkpoint"

    def __init__(self, cfg: InklingTextConfig):
        super().__init__()
        p = get_parallel()
        e, i, h = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
        if e % p.ep_size or i % p.moe_tp_size:
            raise ValueError(
                f"--ep-size {p.ep_size} must divide the routed experts ({e}) and --tp-size / --ep-size "
                f"({p.moe_tp_size}) the expert intermediate size ({i})"
            )
        e, i = e // p.ep_size, i // p.moe_tp_size
        self.first = p.ep_rank * e  # global id of this rank's first expert
        self.holds_all = p.ep_size == 1
        self.nvfp4 = cfg.expert_quant == NVFP4
        experts = Shard(0, p.ep_rank, p.ep_size)
        rows, cols = Shard(1, p.moe_tp_rank, p.moe_tp_size), Shard(2, p.moe_tp_rank, p.moe_tp_size)
        if not self.nvfp4:
            self.w13_weight = nn.Parameter(torch.zeros(e, 2 * i, h))
            self.w2_weight = nn.Parameter(torch.zeros(e, h, i))
            declare(self, "w13_weight", experts, rows)
            declare(self, "w2_weight", experts, cols)
            return
        if h % BLOCK or i % BLOCK:
            raise ValueError(
                f"NVFP4 experts: the hidden size ({h}) and the per-rank expert intermediate size ({i} at "
                f"--tp-size / --ep-size {p.moe_tp_size}) must be multiples of the {BLOCK}-wide scale blocks"
            )
        for name, (n_rows, n_cols), split_dim in (("w13_weight", (2 * i, h), rows), ("w2_weight", (h, i), cols)):
            # Codes and their 16-wide scale blocks split on the same dim, so a shard keeps whole blocks.
            self.register_parameter(name, _frozen(torch.zeros(e, n_rows, n_cols // 2, dtype=torch.uint8)))
            self.register_parameter(f"{name}_scale", _frozen(torch.zeros(e, n_rows, n_cols // BLOCK, dtype=FP8)))
            self.register_parameter(f"{name}_scale2", _frozen(torch.ones(e, dtype=torch.float32)))
            declare(self, name, experts, split_dim)
            declare(self, f"{name}_scale", experts, split_dim)
            declare(self, f"{name}_scale2", experts)

    def use_kernel_layout(self) -> bool:
        """Rearrange NVFP4 codes into the mma layout where the CUDA decode kernels can read them (a GPU
        with bf16 mma, H and I_loc multiples of their 128-element chunk). Once, after loading."""
        w13, w2 = (getattr(self, n, None) for n in ("w13_weight", "w2_weight"))
        if not self.nvfp4 or self.code_layout == "mma" or not w13.is_cuda:
            return False
        if torch.cuda.get_device_capability(w13.device) < (8, 0) or (2 * w13.shape[2]) % 128 or (2 * w2.shape[2]) % 128:
            return False
        for p in (w13, w2):
            to_mma_layout(p.data, inplace=True)
        self.code_layout = "mma"
        return True

    @property
    def num_local(self) -> int:
        return self.w13_weight.shape[0]

    def expert_weights(self, e: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Local expert e's (w13, w2) in `dtype`: NVFP4 dequantized by the reference decoder."""
        if not self.nvfp4:
            return self.w13_weight[e], self.w2_weight[e]
        codes = {n: getattr(self, n)[e : e + 1] for n in ("w13_weight", "w2_weight")}
        if self.code_layout == "mma":
            codes = {n: to_checkpoint_layout(c) for n, c in codes.items()}
        return tuple(
            dequantize_nvfp4(
                codes[n], getattr(self, f"{n}_scale")[e : e + 1],
                getattr(self, f"{n}_scale2")[e : e + 1], dtype,
            )[0]
            for n in ("w13_weight", "w2_weight")
        )  # fmt: skip

    def local_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids -> this rank's expert index; experts held elsewhere map to E_local."""
        if self.holds_all:  # global ids are local ones: no five elementwise launches a layer
            return ids
        n = self.num_local
        rel = ids - self.first
        return torch.where((rel >= 0) & (rel < n), rel, n)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        ids = self.local_ids(ids)
        # Loop over the experts actually hit: the reference path, exact and simple.
        for e in torch.unique(ids).tolist():
            if e == self.num_local:
                continue  # another rank's expert
            tok, slot = torch.where(ids == e)
            y = swiglu_interleaved(x[tok], *self.expert_weights(e, x.dtype))
            out.index_add_(0, tok, (y * weights[tok, slot, None]).to(out.dtype))
        return out


def use_kernel_layouts(model: nn.Module) -> int:
    """After the weights are in (loaded or dummy): NVFP4 experts the CUDA decode kernels can serve get
    their codes in those kernels' layout (RoutedExperts.use_kernel_layout). Returns the layers changed."""
    n = sum(m.use_kernel_layout() for m in model.modules() if isinstance(m, RoutedExperts))
    if n:
        logger.info("NVFP4 experts of %d layers in the CUDA decode kernels' code layout", n)
    return n


def _frozen(t: torch.Tensor) -> nn.Parameter:
    # Integer and fp8 tensors cannot require grad; nothing here trains anyway.
    return nn.Parameter(t, requires_grad=False)


class SharedExperts(nn.Module):
    def __init__(self, cfg: InklingTextConfig):
        super().__init__()
        s, i, h = cfg.n_shared_experts, cfg.moe_intermediate_size, cfg.hidden_size
        inter = split(i, get_parallel(), "expert intermediate size")
        i = local(i, inter)
        self.shared_w13_weight = nn.Parameter(torch.zeros(s, 2 * i, h))
        self.shared_w2_weight = nn.Parameter(torch.zeros(s, h, i))
        declare(self, "shared_w13_weight", Shard(1, inter.part, inter.parts))
        declare(self, "shared_w2_weight", Shard(2, inter.part, inter.parts))

    def forward(self, x: torch.Tensor, gammas: torch.Tensor) -> torch.Tensor:
        acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for s in range(self.shared_w13_weight.shape[0]):
            gu = linear(x, self.shared_w13_weight[s]).unflatten(-1, (-1, 2))
            act = F.silu(gu[..., 0]) * gu[..., 1] * gammas[:, s, None]
            acc += linear(act, self.shared_w2_weight[s]).float()
        return acc.to(x.dtype)


class MoE(nn.Module):
    def __init__(self, cfg: InklingTextConfig):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = RoutedExperts(cfg)
        self.shared_experts = SharedExperts(cfg)

    def align_block_m(self, t: int) -> int | None:
        """The block size of the experts' pair layout (moe_align) for t tokens where the router makes that
        layout in its own launch (route_decode_aligned), else None: up to ALIGNED_ROUTER_MAX_TOKENS
        tokens (and SMALL_ALIGN_PAIRS pairs), the router's ids being the experts' (no expert parallelism:
        local_ids remaps them there), for BF16 experts (fused_moe's blocks) and NVFP4 ones in the CUDA
        decode kernels' layout (their blocks; fused_moe_nvfp4 takes those kernels for bf16 activations
        and aligns for itself otherwise)."""
        e, n_pairs = self.experts, t * self.gate.top_k
        if t > ALIGNED_ROUTER_MAX_TOKENS or not e.holds_all or n_pairs > SMALL_ALIGN_PAIRS:
            return None
        if not e.nvfp4:
            return default_block_m(n_pairs, e.num_local)
        if e.code_layout == "mma":
            from sgl_inkling_kernels.moe_w4a16_cuda import cuda_block_m

            return cuda_block_m(n_pairs, e.num_local, t)
        return None

    def forward(self, x: torch.Tensor, defer_slot_sum: bool = False) -> torch.Tensor | UnsummedSlots:
        """defer_slot_sum: NVFP4 experts may return their per-slot outputs (moe_slots.UnsummedSlots) for
        the launch that reads this output next to sum (sconv_add_decode); other paths return rows."""
        if use_triton(x):  # fused routing and one grouped GEMM over routed + shared experts
            g, e, s = self.gate, self.experts, self.shared_experts
            align = None  # the experts' pair layout, where the router makes it
            sinks_ahead = None
            if e.nvfp4:  # the sinks' gate/up needs no routing: on the side stream while routing
                from sgl_inkling_kernels.fused_moe_nvfp4 import sinks_ahead_nvfp4

                sinks_ahead = sinks_ahead_nvfp4(x, e.w13_weight, s.shared_w13_weight, g.top_k, e.code_layout)
            if x.shape[0] <= FUSED_ROUTER_MAX_TOKENS and fused_decode():  # decode: the router GEMM in the routing kernels
                block_m = self.align_block_m(x.shape[0])
                if block_m is None:
                    ids, w, gam = route_decode(x, g.weight, g.bias, g.global_scale, g.top_k, g.route_scale)
                else:
                    ids, w, gam, align = route_decode_aligned(
                        x, g.weight, g.bias, g.global_scale, g.top_k, g.route_scale, block_m
                    )
            else:
                ids, w, gam = route(
                    linear(x.float(), g.weight.float()), g.bias, g.global_scale, g.top_k, g.route_scale, x.dtype
                )
            foreign = get_parallel().ep_size > 1
            if e.nvfp4:  # W4A16: codes and scales expanded to x.dtype in registers
                from sgl_inkling_kernels.fused_moe_nvfp4 import fused_moe_nvfp4

                return fused_moe_nvfp4(
                    x, e.w13_weight, e.w13_weight_scale, e.w13_weight_scale2,
                    e.w2_weight, e.w2_weight_scale, e.w2_weight_scale2, e.local_ids(ids), w,
                    s.shared_w13_weight, s.shared_w2_weight, gam, foreign_ids=foreign, layout=e.code_layout,
                    alignment=align, sinks_ahead=sinks_ahead, defer_sum=defer_slot_sum,
                )  # fmt: skip
            return fused_moe(
                x, e.w13_weight, e.w2_weight, e.local_ids(ids), w, s.shared_w13_weight, s.shared_w2_weight, gam,
                foreign_ids=foreign, alignment=align,
            )  # fmt: skip
        ids, weights, gammas = self.gate(x)
        return self.experts(x, ids, weights) + self.shared_experts(x, gammas)
