"""Torch reference for paged Inkling attention (decode and extend share it).

Semantics, for query token t of a sequence (absolute position p_t) and key position s:
  visible(t, s) = 0 <= p_t - s  and  (window is None or p_t - s < window)
  score = scaling * <q_t, k_s> + tau_t * bias(t, s),   bias = sum_e rel[t, h, e] * table[e, p_t - s]
with bias 0 for p_t - s >= extent (the table's width). q already carries tau (the model applies it).
Keys live in a paged pool: position s of the sequence in req-to-token row `row` is slot
`req_to_token[row, s]` of `k_buf` / `v_buf` [slots, kv_heads, head_dim]. Everything in fp32.
"""

from __future__ import annotations

import torch


def rel_bias_ref(rel: torch.Tensor, table: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """bias[h, t, s] from rel [t, heads, d_rel] and table [d_rel, extent]; zero outside [0, extent)."""
    extent = table.shape[1]
    dist = q_pos[:, None] - k_pos[None, :]
    cols = table.float()[:, dist.clamp(0, extent - 1)]  # [d_rel, t, s]
    bias = torch.einsum("the,ets->hts", rel.float(), cols)
    return bias.masked_fill(((dist < 0) | (dist >= extent))[None], 0.0)


def paged_attention_ref(
    q: torch.Tensor,  # [T, heads, head_dim]
    k_buf: torch.Tensor,  # [slots, kv_heads, head_dim]
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,  # [rows, max_context]
    req_pool_indices: torch.Tensor,  # [B]
    prefix_lens: torch.Tensor,  # [B] tokens already cached before this batch's new ones
    extend_lens: torch.Tensor,  # [B] new tokens per sequence (all 1 for decode)
    rel: torch.Tensor,  # [T, heads, d_rel]
    table: torch.Tensor,  # [d_rel, extent]
    tau: torch.Tensor | None,  # [T]
    scaling: float,
    window: int | None,
) -> torch.Tensor:
    """Attention output [T, heads * head_dim] in q's dtype; new tokens' KV must already be in the pool."""
    t_total, heads, dim = q.shape
    kv_heads = k_buf.shape[1]
    groups = heads // kv_heads
    out = torch.empty(t_total, heads * dim, dtype=q.dtype, device=q.device)
    offset = 0
    for row, prefix, n in zip(req_pool_indices.tolist(), prefix_lens.tolist(), extend_lens.tolist()):
        seq_len = prefix + n
        start = max(0, prefix - window + 1) if window is not None else 0
        k_pos = torch.arange(start, seq_len, device=q.device)
        q_pos = torch.arange(prefix, seq_len, device=q.device)
        slots = req_to_token[row, start:seq_len]
        keys = k_buf[slots].float().repeat_interleave(groups, dim=1)  # [S, heads, d]
        values = v_buf[slots].float().repeat_interleave(groups, dim=1)
        qs = q[offset : offset + n].float()
        scores = torch.einsum("thd,shd->hts", qs, keys) * scaling
        bias = rel_bias_ref(rel[offset : offset + n], table, q_pos, k_pos)
        if tau is not None:
            bias = bias * tau[offset : offset + n].float()[None, :, None]
        scores = scores + bias
        dist = q_pos[:, None] - k_pos[None, :]
        hidden = dist < 0
        if window is not None:
            hidden |= dist >= window
        probs = torch.softmax(scores.masked_fill(hidden[None], float("-inf")), dim=-1)
        o = torch.einsum("hts,shd->thd", probs, values)
        out[offset : offset + n] = o.reshape(n, heads * dim).to(q.dtype)
        offset += n
    return out
