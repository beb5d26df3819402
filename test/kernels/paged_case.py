"""Random paged-attention problems shared by the attention kernel tests.

Slots are scattered (a random permutation of the pool) and request rows are not 0..B-1, so a
kernel that assumes contiguous KV or row == sequence index fails. Nothing is zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedCase:
    q: torch.Tensor  # [T, heads, dim]
    k_buf: torch.Tensor
    v_buf: torch.Tensor
    req_to_token: torch.Tensor
    rows: torch.Tensor  # [B]
    prefix_lens: torch.Tensor  # [B]
    extend_lens: torch.Tensor  # [B]
    rel: torch.Tensor  # [T, heads, d_rel]
    table: torch.Tensor  # [d_rel, extent]
    tau: torch.Tensor | None  # [T]

    @property
    def positions(self) -> torch.Tensor:
        return torch.cat([torch.arange(p, p + n) for p, n in zip(self.prefix_lens.tolist(), self.extend_lens.tolist())]).to(
            self.q.device
        )


def make_case(
    prefix_lens: list[int],
    extend_lens: list[int],
    heads: int,
    kv_heads: int,
    dim: int,
    d_rel: int,
    extent: int,
    with_tau: bool,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> PagedCase:
    g = torch.Generator().manual_seed(seed)
    seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
    n_slots = sum(seq_lens) + 7
    max_ctx = max(seq_lens) + 5
    b = len(seq_lens)
    n_rows = b + 3
    rows = torch.randperm(n_rows, generator=g)[:b]
    # Slot 0 is the pool's padding slot: never handed out, but filled so reading it would show.
    perm = torch.randperm(n_slots, generator=g) + 1
    req_to_token = torch.zeros(n_rows, max_ctx, dtype=torch.int64)
    used = 0
    for r, n in zip(rows.tolist(), seq_lens):
        req_to_token[r, :n] = perm[used : used + n]
        used += n
    t = sum(extend_lens)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    case = PagedCase(
        q=rnd(t, heads, dim, scale=2.0),
        k_buf=rnd(n_slots + 1, kv_heads, dim),
        v_buf=rnd(n_slots + 1, kv_heads, dim),
        req_to_token=req_to_token,
        rows=rows,
        prefix_lens=torch.tensor(prefix_lens),
        extend_lens=torch.tensor(extend_lens),
        rel=rnd(t, heads, d_rel),
        table=rnd(d_rel, extent, scale=0.5),
        tau=(1.0 + 0.5 * torch.rand(t, generator=g)) if with_tau else None,
    )
    for name in ("q", "k_buf", "v_buf", "req_to_token", "rows", "prefix_lens", "extend_lens", "rel", "table", "tau"):
        v = getattr(case, name)
        if v is not None:
            setattr(case, name, v.to(device))
    return case
