"""Reference attention backend: gathers each sequence's KV from the pool and attends in fp32."""

from __future__ import annotations

import torch

from sgl_inkling.layers.attention.base import AttentionBackend, AttnLayerSpec
from sgl_inkling.model_executor.forward_batch import ForwardBatch


def relative_bias(
    rel: torch.Tensor, rel_table: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor:
    """bias[h, t, s] = sum_e rel[t, h, e] * table[e, q_pos[t] - k_pos[s]], zero outside [0, extent)."""
    extent = rel_table.shape[1]
    profiles = rel.float() @ rel_table.float()  # [t, h, extent]
    dist = q_pos[:, None] - k_pos[None, :]  # [t, s]
    idx = dist.clamp(0, extent - 1)[:, None, :].expand(-1, profiles.shape[1], -1)
    bias = profiles.gather(-1, idx)  # [t, h, s]
    bias = bias.masked_fill(((dist < 0) | (dist >= extent))[:, None, :], 0.0)
    return bias.transpose(0, 1)  # [h, t, s]


class TorchNativeBackend(AttentionBackend):
    def forward(self, q, k, v, rel, rel_table, tau, spec: AttnLayerSpec, batch: ForwardBatch):
        pool, table = self.pool_of(spec)
        loc = batch.out_loc_swa if spec.sliding else batch.out_loc
        pool.write(spec.layer_id, loc, k, v)
        k_buf, v_buf = pool.buffers(spec.layer_id)

        groups = spec.num_heads // spec.num_kv_heads
        out = torch.empty(q.shape[0], spec.num_heads * spec.head_dim, dtype=q.dtype, device=q.device)
        rows = batch.req_pool_indices.tolist()
        offset = 0
        for row, prefix, n in zip(rows, batch.prefix_lens_cpu, batch.extend_lens_cpu):
            seq_len = prefix + n
            # Sliding layers only keep (and only need) the last `window` keys of the first query.
            start = max(0, prefix - spec.window + 1) if spec.window is not None else 0
            slots = table[row, start:seq_len]
            keys = k_buf[slots].float()  # [S, kv, d]
            values = v_buf[slots].float()
            qs = q[offset : offset + n].float().view(n, spec.num_kv_heads, groups, spec.head_dim)
            scores = torch.einsum("tkgd,skd->kgts", qs, keys) * spec.scaling  # [kv, g, t, s]

            q_pos = torch.arange(prefix, seq_len, device=q.device)
            k_pos = torch.arange(start, seq_len, device=q.device)
            bias = relative_bias(rel[offset : offset + n], rel_table, q_pos, k_pos)  # [h, t, s]
            if tau is not None:
                bias = bias * tau[offset : offset + n].float()[None, :, None]
            scores = scores + bias.view(spec.num_kv_heads, groups, n, -1)

            dist = q_pos[:, None] - k_pos[None, :]
            hidden = dist < 0
            if spec.window is not None:
                hidden |= dist >= spec.window
            scores = scores.masked_fill(hidden, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            o = torch.einsum("kgts,skd->tkgd", probs, values)
            out[offset : offset + n] = o.reshape(n, -1).to(q.dtype)
            offset += n
        return out
