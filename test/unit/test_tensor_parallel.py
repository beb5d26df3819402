"""TP 2 (and TP 2 with EP 2) over two gloo processes matches TP 1 on inkling-tiny in float32, and
each rank holds only its shard of the weights, the KV heads and the short-conv state."""

from __future__ import annotations

import pytest
import torch

from sgl_inkling.models.inkling.tiny import TINY_CONFIG
from test.unit.tp_scenario import DECODE_STEPS, run_ranks, scenario

TEXT = TINY_CONFIG["text_config"]
H = TEXT["hidden_size"]


@pytest.fixture(scope="module")
def reference(tiny_model):
    return scenario(tiny_model)


@pytest.mark.parametrize("ep", [1, 2], ids=["tp2", "tp2-ep2"])
def test_tp2_matches_tp1(tiny_path, tmp_path, reference, ep):
    ranks = run_ranks(tiny_path, tmp_path, tp=2, ep=ep)
    ref = reference
    assert len(ref["tokens"]) == DECODE_STEPS + 1
    for r, res in enumerate(ranks):
        # Same greedy tokens; logits differ only by the order of the partial-sum reduction.
        assert res["tokens"] == ref["tokens"]
        torch.testing.assert_close(res["logits"], ref["logits"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(res["mtp_logits"], ref["mtp_logits"], rtol=1e-4, atol=1e-4)

        # Each rank stores half of the output-conv state: exactly its hidden channels of TP 1's state.
        layer = ref["full_layer"]
        for key in ("attn_state", "mlp_state"):
            half = slice(r * H // 2, (r + 1) * H // 2)
            assert res[key].shape[-1] == H // 2
            torch.testing.assert_close(res[key], ref[key][..., half], rtol=1e-4, atol=1e-5)
        for lay, shapes in res["sconv_shapes"].items():
            full = ref["sconv_shapes"][lay]
            for stream, (mine, whole) in enumerate(zip(shapes, full)):
                assert mine[:2] == whole[:2] and mine[2] * 2 == whole[2], (lay, stream, mine, whole)
        # K stream of a full layer: this rank's one of the two KV heads.
        hd = TEXT["head_dim"]
        torch.testing.assert_close(res["k_state"], ref["k_state"][..., r * hd : (r + 1) * hd], rtol=1e-4, atol=1e-5)
        assert res["kv_heads"] == (TEXT["num_key_value_heads"] // 2, TEXT["swa_num_key_value_heads"] // 2)

        e, two_i, h = ref["expert_shape"]
        expected = (e // 2, two_i, h) if ep == 2 else (e, two_i // 2, h)
        assert res["expert_shape"] == expected
        assert layer == res["full_layer"]
