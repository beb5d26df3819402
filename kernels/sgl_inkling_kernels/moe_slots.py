"""The NVFP4 fused MoE's per-slot outputs and their sum.

fused_moe_nvfp4's kernels write each (token, slot) product to its own fp32 row of out [T, k + S, H]
(k routed slots, then the S sinks), so no zero-filled buffer and no atomics are needed; the token's
output is the sum over its slots, leaving out routed slots whose expert is foreign (never written).
That sum is its own launch (sum_slots) or, at decode, folded into the launch that reads the MoE's
output next (sconv_norm's FFN output conv), which loads `slot_sum` instead of a summed row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_inkling_kernels._triton import interpreting, next_pow2, pdl_launch, pdl_wait, tl, triton


@dataclass(frozen=True)
class UnsummedSlots:
    """A MoE output left as its slots: the token rows are sum_slots(self), rounded to `dtype`."""

    out: torch.Tensor  # [T, k + S, H] fp32
    ids: torch.Tensor  # [T, k] local expert ids (num_experts = foreign: slot left out)
    num_experts: int
    dtype: torch.dtype  # of the summed rows (the MoE input's)

    @property
    def shape(self) -> tuple[int, int]:
        return self.out.shape[0], self.out.shape[2]


@triton.jit
def slot_sum(Out, Ids, t, offs, ok, s_ot, s_os, num_experts, TOPK: tl.constexpr, SLOTS: tl.constexpr):
    """fp32 sum of token t's slots at columns offs (routed slots of foreign experts left out)."""
    acc = tl.zeros(offs.shape, tl.float32)
    for k in tl.static_range(SLOTS):
        if k < TOPK:
            m = ok & (tl.load(Ids + t * TOPK + k + 0 * offs) < num_experts)
        else:
            m = ok
        acc += tl.load(Out + t * s_ot + k * s_os + offs, mask=m, other=0.0)
    return acc


@triton.jit
def _sum_slots_kernel(Out, Ids, Y, s_ot, s_os, s_yt, H, num_experts,
                      TOPK: tl.constexpr, SLOTS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    pdl_wait(PDL)
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < H
    acc = slot_sum(Out, Ids, t, offs, ok, s_ot, s_os, num_experts, TOPK, SLOTS)
    tl.store(Y + t * s_yt + offs, acc.to(Y.dtype.element_ty), mask=ok)


def sum_slots(slots: UnsummedSlots) -> torch.Tensor:
    """[T, H] rows in slots.dtype: each token's slots summed in fp32 (one launch)."""
    out, ids = slots.out, slots.ids
    t, n_slots, h = out.shape
    y = torch.empty(t, h, dtype=slots.dtype, device=out.device)
    if t:
        block = min(next_pow2(h), 64 if interpreting() else 1024)
        _sum_slots_kernel[(t, triton.cdiv(h, block))](
            out, ids, y, out.stride(0), out.stride(1), y.stride(0), h, slots.num_experts,
            TOPK=ids.shape[1], SLOTS=n_slots, BLOCK=block, **pdl_launch(out),
        )  # fmt: skip
    return y
