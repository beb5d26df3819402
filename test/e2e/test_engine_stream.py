"""sglang.Engine streaming with --incremental-streaming-output (incremental_streaming_output=True): the
chunks carry only what is new, and together they are the answer the default HTTP server gives."""

from __future__ import annotations

import os

from sgl_inkling.managers.subprocess_utils import ipc_dir
from test.unit.helpers import random_prompt


def test_engine_incremental_stream_adds_up_to_the_servers_answer(server, tiny_path):
    import sglang as sgl

    body = {"input_ids": random_prompt(10, seed=61), "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}}  # fmt: skip
    whole = server.generate(**body)
    eng = sgl.Engine(model_path=str(tiny_path), incremental_streaming_output=True)
    sockets = ipc_dir(eng.backend.addrs["scheduler"])
    try:
        assert os.path.isdir(sockets)
        chunks = list(eng.generate(stream=True, **body))
    finally:
        eng.shutdown()
    assert not os.path.exists(sockets), "the Engine's socket files outlived its shutdown"
    # Each chunk only its new tokens (a chunk may carry several when the consumer lags a step).
    assert len(chunks) >= 2 and all(c["output_ids"] for c in chunks)
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    got = [tuple(x[:2]) for c in chunks for x in c["meta_info"]["output_token_logprobs"]]
    want = [tuple(x[:2]) for x in whole["meta_info"]["output_token_logprobs"]]
    assert [t for _, t in got] == [t for _, t in want]
    assert all(abs(a - b) < 1e-4 for (a, _), (b, _) in zip(got, want))
