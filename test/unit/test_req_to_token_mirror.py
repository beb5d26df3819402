"""The req-to-token tables as the GPU keeps them: device tables beside host mirrors (on the CPU the
mirror is the table itself, so the staged device writes run only when the two are apart, as here).
Point writes land in both, at exactly the entries given."""

import torch

from sgl_inkling.mem_cache.memory_pool import ReqToTokenPool


def _apart(size: int = 5, ctx: int = 12) -> ReqToTokenPool:
    pool = ReqToTokenPool(size, ctx, "cpu")
    pool.host = {"full": torch.zeros_like(pool.full), "swa": torch.zeros_like(pool.swa)}  # as on a GPU
    return pool


def test_a_decode_steps_slots_land_in_both_tables_and_their_mirrors():
    pool = _apart()
    rows, positions = torch.tensor([3, 0, 4]), torch.tensor([7, 0, 11])
    full, swa = torch.tensor([21, 22, 23]), torch.tensor([31, 32, 33])
    pool.write_points(rows, positions, {"full": full, "swa": swa})
    for kind, slots in (("full", full), ("swa", swa)):
        want = torch.zeros(6, 12, dtype=torch.int64)
        for r, p, v in zip(rows.tolist(), positions.tolist(), slots.tolist()):
            want[r, p] = v
        assert torch.equal(getattr(pool, kind), want), kind
        assert torch.equal(pool.host[kind], want), kind


def test_both_at_once_equals_one_table_at_a_time():
    one, both = _apart(), _apart()
    g = torch.Generator().manual_seed(1)
    rows, positions = torch.randperm(5, generator=g), torch.randint(0, 12, (5,), generator=g)
    full, swa = torch.randint(1, 99, (5,), generator=g), torch.randint(1, 99, (5,), generator=g)
    one.write_points(rows, positions, {"full": full})
    one.write_points(rows, positions, {"swa": swa})
    both.write_points(rows, positions, {"full": full, "swa": swa})
    for kind in ("full", "swa"):
        assert torch.equal(getattr(one, kind), getattr(both, kind))
        assert torch.equal(one.host[kind], both.host[kind])
