"""Reference attention backend: gathers each sequence's KV from the pool and attends in fp32.

Batch invariance: a query's result must not depend on how its sequence was chunked or which
cached prefix it resumed from (the radix cache promises bitwise-equal logits in fp32 on CPU).
So every reduction has a fixed shape anchored at absolute key positions: scores are elementwise
products summed over head_dim, keys are grouped in blocks of BLOCK absolute positions, each block
is summed on its own and blocks are accumulated left to right (cumsum), so masked or absent
leading blocks add exact zeros. Query rows are processed in groups only to bound memory.
"""

from __future__ import annotations

import torch

from sgl_inkling.layers.attention.base import AttentionBackend, AttnLayerSpec
from sgl_inkling.model_executor.forward_batch import ForwardBatch

BLOCK = 16  # keys per reduction block, anchored at absolute position 0
Q_GROUP = 64  # query rows per step (memory bound only)


def relative_bias(
    rel: torch.Tensor, rel_table: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor:
    """bias[h, t, s] = sum_e rel[t, h, e] * table[e, q_pos[t] - k_pos[s]], zero outside [0, extent)."""
    extent = rel_table.shape[1]
    profiles = (rel.float()[..., None] * rel_table.float()).sum(-2)  # [t, h, extent]
    dist = q_pos[:, None] - k_pos[None, :]  # [t, s]
    idx = dist.clamp(0, extent - 1)[:, None, :].expand(-1, profiles.shape[1], -1)
    bias = profiles.gather(-1, idx)  # [t, h, s]
    bias = bias.masked_fill(((dist < 0) | (dist >= extent))[:, None, :], 0.0)
    return bias.transpose(0, 1)  # [h, t, s]


def _attend_rows(
    q: torch.Tensor,  # [t, kv, g, d] fp32
    keys: torch.Tensor,  # [S, kv, d] fp32, S a multiple of BLOCK, zeros where absent
    values: torch.Tensor,
    bias: torch.Tensor,  # [h, t, S]
    hidden: torch.Tensor,  # [t, S] True where the key is not visible
    scaling: float,
) -> torch.Tensor:
    t, kv, g, d = q.shape
    scores = (q.permute(1, 2, 0, 3)[:, :, :, None, :] * keys.permute(1, 0, 2)[:, None, None]).sum(-1)
    scores = scores * scaling + bias.view(kv, g, t, -1)  # [kv, g, t, S]
    scores = scores.masked_fill(hidden, float("-inf"))
    e = torch.exp(scores - scores.amax(-1, keepdim=True)).unflatten(-1, (-1, BLOCK))  # [kv, g, t, nb, B]
    denom = e.sum(-1).cumsum(-1)[..., -1]  # [kv, g, t]
    v_blocks = values.permute(1, 0, 2).unflatten(1, (-1, BLOCK))  # [kv, nb, B, d]
    numer = (e[..., None] * v_blocks[:, None, None]).sum(-2).cumsum(-2)[..., -1, :]  # [kv, g, t, d]
    return (numer / denom[..., None]).permute(2, 0, 1, 3).reshape(t, kv * g * d)


class TorchNativeBackend(AttentionBackend):
    def forward(self, q, k, v, rel, rel_table, tau, spec: AttnLayerSpec, batch: ForwardBatch):
        pool, table = self.pool_of(spec, batch.table_offset)
        loc = batch.out_loc_swa if spec.sliding else batch.out_loc
        if k is not None:
            pool.write(spec.layer_id, loc, k, v)
        k_buf, v_buf = pool.buffers(spec.layer_id)

        groups = spec.num_heads // spec.num_kv_heads
        out = torch.empty(q.shape[0], spec.num_heads * spec.head_dim, dtype=q.dtype, device=q.device)
        offset = 0
        for row, prefix, n in zip(
            batch.rows_cpu(), batch.prefix_lens_cpu, batch.extend_lens_cpu
        ):
            seq_len = prefix + n
            # Sliding layers keep (and need) only the keys inside the first query's window.
            start = max(0, prefix - spec.window + 1) if spec.window is not None else 0
            k_pos = torch.arange(start // BLOCK * BLOCK, -(-seq_len // BLOCK) * BLOCK, device=q.device)
            present = (k_pos >= start) & (k_pos < seq_len)
            slots = torch.where(present, table[row, k_pos.clamp(max=table.shape[1] - 1)], 0)
            keys = k_buf[slots].float().masked_fill(~present[:, None, None], 0.0)
            values = v_buf[slots].float().masked_fill(~present[:, None, None], 0.0)
            for a in range(0, n, Q_GROUP):
                b = min(n, a + Q_GROUP)
                q_pos = torch.arange(prefix + a, prefix + b, device=q.device)
                dist = q_pos[:, None] - k_pos[None, :]
                hidden = (dist < 0) | ~present[None, :]
                if spec.window is not None:
                    hidden |= dist >= spec.window
                bias = relative_bias(rel[offset + a : offset + b], rel_table, q_pos, k_pos)
                if tau is not None:
                    bias = bias * tau[offset + a : offset + b].float()[None, :, None]
                qs = q[offset + a : offset + b].float().view(b - a, spec.num_kv_heads, groups, spec.head_dim)
                out[offset + a : offset + b] = _attend_rows(qs, keys, values, bias, hidden, spec.scaling).to(
                    q.dtype
                )
            offset += n
        return out
