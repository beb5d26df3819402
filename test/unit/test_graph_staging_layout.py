"""CudaGraphRunner.stage_decode writes a decode batch straight into the graphs' static inputs (the
GPU test test/gpu/test_graph_staging.py runs it against eager decode); here, on the CPU and without
graphs, its batch holds what ForwardBatch.build makes of the same lists, and the padding rows up to
the bucket read the reserved row, position 0 and slot 0."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgl_inkling.model_executor.cuda_graph_runner import CudaGraphRunner, bucket_for, buckets_up_to
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode

PAD_ROW = 9
FIELDS = ("input_ids", "positions", "req_pool_indices", "prefix_lens", "extend_lens", "out_loc", "out_loc_swa",
          "logits_indices")  # fmt: skip


def staging_runner(max_bs: int, buckets=None) -> CudaGraphRunner:
    runner = SimpleNamespace(device=torch.device("cpu"), req_to_token=SimpleNamespace(pad_row=PAD_ROW))
    return CudaGraphRunner(runner, max_bs, capture=False, buckets=buckets)


@pytest.mark.parametrize("bs", [1, 3, 4, 5, 8])
@pytest.mark.parametrize("ids_on_device", [False, True])
def test_staged_batch_equals_the_built_one_with_padding_after_it(bs, ids_on_device):
    g = staging_runner(8)  # buckets 1, 2, 4, 8: 3 and 5 pad
    gen = torch.Generator().manual_seed(bs)
    ids = torch.randint(0, 1000, (bs,), generator=gen).tolist()
    rows = torch.randperm(8, generator=gen)[:bs].tolist()
    prefix = torch.randint(1, 5000, (bs,), generator=gen).tolist()
    full, swa = (torch.randint(1, 10**6, (bs,), generator=gen).tolist() for _ in range(2))
    g.inputs.fill_(-7)  # whatever an earlier step left there
    given = torch.tensor(ids).view(-1, 1) if ids_on_device else [[x] for x in ids]
    staged = g.stage_decode(given, rows, prefix, full, swa)
    built = ForwardBatch.build(ForwardMode.DECODE, [[x] for x in ids], rows, prefix, full, swa, "cpu")
    for f in FIELDS:
        assert getattr(staged, f).tolist() == getattr(built, f).tolist(), f
    assert staged.prefix_lens_cpu == prefix and staged.extend_lens_cpu == [1] * bs
    assert staged.rows_cpu() == rows and staged.batch_size == bs
    assert staged.positions.data_ptr() == g.static["positions"].data_ptr()  # replay copies nothing
    bucket = next(b for b in g.buckets if b >= bs)
    pad = {f: g.static[f][bs:bucket].tolist() for f in g.static}
    want = [0] * (bucket - bs)
    assert pad == {"input_ids": want, "positions": want, "req_pool_indices": [PAD_ROW] * (bucket - bs),
                   "prefix_lens": want, "out_loc": want, "out_loc_swa": want}  # fmt: skip


def test_batches_past_the_largest_graph_are_not_staged():
    g = staging_runner(4)
    assert g.stage_decode([[1]] * 5, list(range(5)), [1] * 5, [1] * 5, [1] * 5) is None


@pytest.mark.parametrize("max_bs", [1, 3, 8])
def test_every_static_field_starts_16_byte_aligned(max_bs):
    # Triton compiles a variant per pointer alignment: an odd largest bucket left every other field of
    # the [fields, max_bs] block 8-byte aligned, variants warm-up never compiled.
    g = staging_runner(max_bs)
    assert {f: t.data_ptr() % 16 for f, t in g.static.items()} == {f: 0 for f in g.static}
    for bs in g.buckets:
        staged = g.stage_decode([[1]] * bs, list(range(bs)), [1] * bs, [1] * bs, [1] * bs)
        assert all(getattr(staged, f).data_ptr() % 16 == 0 for f in ("positions", "out_loc", "out_loc_swa"))


def test_given_buckets_are_captured_and_batches_pad_to_the_next_one():
    # --cuda-graph-bs 1 3 6: exactly those, a batch of 2 pads to 3 and of 4 to 6; 7 runs eagerly; the
    # speculative graphs capture the same sizes up to their own largest (graph_buckets).
    from sgl_inkling.model_executor.cuda_graph_runner import buckets_up_to, graph_buckets

    g = staging_runner(6, buckets=[6, 1, 3])
    assert g.buckets == [1, 3, 6]
    for bs, bucket in ((1, 1), (2, 3), (3, 3), (4, 6), (6, 6)):
        staged = g.stage_decode([[5]] * bs, list(range(bs)), [2] * bs, [1] * bs, [1] * bs)
        assert staged.batch_size == bs and g.static["req_pool_indices"][bs:bucket].tolist() == [PAD_ROW] * (bucket - bs)
    assert g.stage_decode([[5]] * 7, list(range(7)), [2] * 7, [1] * 7, [1] * 7) is None
    runner = SimpleNamespace(graphs=g)
    assert graph_buckets(runner, 6) == [1, 3, 6] and graph_buckets(runner, 3) == [1, 3]
    assert graph_buckets(SimpleNamespace(graphs=None), 6) == buckets_up_to(6)
    standard = SimpleNamespace(graphs=staging_runner(64))  # the default: the same as before
    assert all(graph_buckets(standard, m) == buckets_up_to(m) for m in standard.graphs.buckets)


def test_the_adaptive_benchmarks_buckets_pad_catch_ups_as_the_standard_ones():
    """bench_one_batch --mtp's graph sizes (mtp_adaptive.timed_buckets): a tail catch-up of r <= 32
    requests pads to the bucket the standard set would give it (not to the timed batch: 24ab9bd's
    batch-64 draft steps ran every catch-up at 64 rows), the timed batch has its own graph, and the
    kept verify logits (their sum) stay below those of the standard buckets up to 48."""
    from benchmark.mtp_adaptive import timed_buckets

    for bsz in (1, 3, 8, 48, 64):
        got, std = timed_buckets(bsz), buckets_up_to(bsz)
        assert got[-1] == bsz
        for r in range(1, min(bsz, 32) + 1):
            assert bucket_for(got, r) == bucket_for(std, r), (bsz, r)
    assert sum(timed_buckets(64)) < sum(buckets_up_to(48))
