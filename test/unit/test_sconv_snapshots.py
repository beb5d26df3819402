"""Short-conv snapshots taken inside an extend (the prefix cache's checkpoints) against the definition
written out here: snapshot (j, slot) of a sequence is rows [j, j + K-1) of its window, the prior
state (zeros without a cached prefix) followed by the chunk's inputs."""

from types import SimpleNamespace

import torch

from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.models.inkling.sconv import _snapshot

WIDTH, C = 3, 5  # Inkling's kernel of 4: three rows of state


def test_batched_snapshots_equal_slices_of_each_window():
    g = torch.Generator().manual_seed(0)
    rows, prefix, lens = [4, 1, 6, 2], [10, 0, 7, 3], [9, 6, 1, 5]
    fb = ForwardBatch.build(
        ForwardMode.EXTEND, [[0] * n for n in lens], rows, prefix, [0] * sum(lens), [0] * sum(lens), "cpu"
    )
    # Points inside the prior state (j < 3), across its edge, in the chunk, at its end (j = n, MTP's
    # levels take those); a sequence without a cached prefix; one with none.
    fb.sconv_snapshots = {0: [(1, 7), (2, 3), (5, 0), (9, 11)], 1: [(0, 5), (2, 9), (4, 1)], 3: [(3, 2)]}
    store = torch.full((12, WIDTH, C), float("nan"), dtype=torch.bfloat16)
    fb.sconv_checkpoints = SimpleNamespace(store={0: [store]})
    x = torch.randn(sum(lens), C, generator=g).to(torch.bfloat16)
    state = torch.randn(8, WIDTH, C, generator=g)
    before = state.clone()

    _snapshot(x, state, fb, 0, 0)

    want = torch.full_like(store, float("nan"))
    start = 0
    for i, n in enumerate(lens):
        prev = before[rows[i]] if prefix[i] > 0 else torch.zeros(WIDTH, C)
        window = torch.cat([prev, x[start : start + n].float()])
        for j, slot in fb.sconv_snapshots.get(i, []):
            want[slot] = window[j : j + WIDTH].to(store.dtype)
        start += n
    assert torch.equal(store.isnan(), want.isnan())  # no other slot written
    assert torch.equal(store.nan_to_num(), want.nan_to_num())
    assert torch.equal(state, before)  # read before the conv moves it on
    assert len(fb.snapshot_index_cache) == 1  # built once for every layer and stream of the forward


def test_a_batch_without_snapshots_writes_nothing():
    fb = ForwardBatch.build(ForwardMode.EXTEND, [[0] * 4], [0], [0], [0] * 4, [0] * 4, "cpu")
    fb.sconv_snapshots = {0: []}
    store = torch.zeros(2, WIDTH, C)
    fb.sconv_checkpoints = SimpleNamespace(store={0: [store]})
    _snapshot(torch.ones(4, C), torch.ones(1, WIDTH, C), fb, 0, 0)
    assert not store.any()
