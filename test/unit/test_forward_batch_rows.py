"""ForwardBatch keeps its rows on the host when it was built from host lists, so the per-sequence
loops of the short conv (prefix-cache snapshots inside a mixed step, the reference paths) do not wait
for the device: on a GPU, `.tolist()` of the device tensor would block the overlapped host until the
step before finished."""

from __future__ import annotations

import torch

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode


class _NoRead:
    def tolist(self):
        raise AssertionError("read the rows back from the device")


def test_rows_come_from_the_host_copy():
    fb = ForwardBatch.build(ForwardMode.EXTEND, [[5, 6, 7], [8]], [3, 1], [0, 4], [1, 2, 3, 4], [1, 2, 3, 4], "cpu")
    assert fb.req_pool_indices.tolist() == [3, 1]
    fb.req_pool_indices = _NoRead()  # a device tensor stands in: reading it would be the sync
    assert fb.rows_cpu() == [3, 1]


def test_static_batches_without_a_host_copy_read_the_tensor():
    fb = ForwardBatch.build(ForwardMode.DECODE, [[1], [2]], [0, 2], [3, 3], [7, 8], [7, 8], "cpu")
    fb.req_pool_indices_cpu = []  # as the graph runners' batches, built on the device
    fb.req_pool_indices = torch.tensor([4, 9])
    assert fb.rows_cpu() == [4, 9]
