"""benchmark/engine_timings.py's mixed step (`--mixed-riders`): each rider in `mixed_batch` is a decode
token at the decode depth beside the prompt's prefill, so its logits equal those of a plain decode
step of the same tokens, rows and slots run on a second copy of the engine (the same dummy weights,
fresh pools) on inkling-tiny in fp32."""

from __future__ import annotations

import torch

from benchmark import engine_timings
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode

PROMPT, OUTPUT, RIDERS = 40, 8, 3  # riders 44 tokens deep: past tiny's sliding window of 16


def _engine():
    return engine_timings.build_engine("tiny", None, torch.device("cpu"), 0, RIDERS + 1, PROMPT, OUTPUT)


def test_mixed_riders_decode_as_a_decode_step_would():
    e = _engine()
    with engine_timings.mixed_batch(e.runner, PROMPT, e.vocab, torch.Generator().manual_seed(1), RIDERS, e.ctx,
                                    e.window) as fb:  # fmt: skip
        assert fb.extend_lens_cpu == [PROMPT] + [1] * RIDERS and fb.prefix_lens_cpu == [0] + [e.ctx] * RIDERS
        got = e.runner.forward(fb).logits[1:]  # one row per sequence: the prompt's last, then the riders'
        ids = fb.input_ids[-RIDERS:].view(-1, 1).tolist()
        rows, full, swa = (t[-RIDERS:].tolist() for t in (fb.req_pool_indices, fb.out_loc, fb.out_loc_swa))
    e2 = _engine()
    # The same allocations (same generator), nothing run: the riders' rows and slots as in e.
    with engine_timings.mixed_batch(e2.runner, PROMPT, e2.vocab, torch.Generator().manual_seed(1), RIDERS, e2.ctx,
                                    e2.window) as fb2:  # fmt: skip
        assert fb2.req_pool_indices[-RIDERS:].tolist() == rows
        decode = ForwardBatch.build(ForwardMode.DECODE, ids, rows, [e2.ctx] * RIDERS, full, swa, "cpu")
        want = e2.runner.forward(decode).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
