"""`--tp-size 2`: two scheduler processes (gloo) serve the same greedy output as TP 1, with the radix
cache on, and rank 0 reports holding half of the output-conv state and of the KV heads; the same
over a two-"node" launch on this machine (--nnodes 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sgl_inkling.models.inkling.tiny import TINY_CONFIG
from test.unit.helpers import random_prompt

from .server import ServerProcess, free_port

TEXT = TINY_CONFIG["text_config"]
SP = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def tp2(tiny_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp2")  # the server's temp dir: its socket files are found there
    s = ServerProcess("--skip-server-warmup", "--tp-size", "2", env={"TMPDIR": str(tmp)})
    s.tmp = tmp
    yield s
    s.stop()
    assert not list(tmp.glob("sglang-inkling-*")), "socket files outlived the server"


def gen(server, ids: list[int]) -> dict:
    return server.generate(input_ids=ids, sampling_params=SP, return_logprob=True)


def test_tp2_greedy_matches_tp1_with_prefix_cache(server, tp2):
    base = random_prompt(70, seed=77)
    prompts = [base + random_prompt(n, seed=s) for n, s in ((11, 1), (29, 2), (5, 3))]
    # Sequential first (later prompts hit the cached prefix), then all at once (one batch).
    for ids in prompts:
        got, want = gen(tp2, ids), gen(server, ids)
        assert got["output_ids"] == want["output_ids"]
        for mine, ref in zip(got["meta_info"]["output_token_logprobs"], want["meta_info"]["output_token_logprobs"]):
            assert mine[1] == ref[1] and abs(mine[0] - ref[0]) < 1e-3  # (logprob, token id, ...)
    assert gen(tp2, prompts[-1])["meta_info"]["cached_tokens"] >= 70
    batch = [random_prompt(20 + 7 * i, seed=100 + i) for i in range(4)]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda ids: gen(tp2, ids)["output_ids"], batch))
    assert got == [gen(server, ids)["output_ids"] for ids in batch]
    assert tp2.internal_state()["tp_ranks_agree"]
    tp2.wait_idle_baseline()


def test_tp2_rank_holds_half_of_the_state(tp2):
    # One socket directory while serving: the front end's; rank 1's private endpoint is unlinked.
    assert len(list(tp2.tmp.glob("sglang-inkling-*"))) == 1
    st = tp2.internal_state()
    assert (st["tp_size"], st["ep_size"]) == (2, 1)
    h, hd = TEXT["hidden_size"], TEXT["head_dim"]
    assert st["kv_heads"] == {"full": TEXT["num_key_value_heads"] // 2, "swa": TEXT["swa_num_key_value_heads"] // 2}
    n_layers = TEXT["num_hidden_layers"] + TINY_CONFIG["mtp_config"]["num_nextn_predict_layers"]
    assert len(st["sconv_channels"]) == n_layers
    for layer, (k, v, attn_out, mlp_out) in st["sconv_channels"].items():
        sliding = int(layer) < TEXT["num_hidden_layers"] and TEXT["layer_types"][int(layer)] == "hybrid_sliding"
        kv = (TEXT["swa_num_key_value_heads"] if sliding else TEXT["num_key_value_heads"]) // 2 * hd
        if int(layer) < TEXT["num_hidden_layers"]:
            assert (k, v) == (kv, kv)
        assert (attn_out, mlp_out) == (h // 2, h // 2)


def test_two_node_launch_serves_from_node_0_only(server):
    """--nnodes 2 on one machine: node 1 runs TP rank 1 without HTTP; node 0 serves; the output equals
    TP 1; when node 0 goes, node 1 exits instead of hanging."""
    rendezvous = f"127.0.0.1:{free_port()}"
    node1_port = free_port()
    flags = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", rendezvous, "--skip-server-warmup"]
    node1 = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", *flags, "--node-rank", "1", "--port", str(node1_port),
         "--log-level", "warning"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        node0 = ServerProcess(*flags, "--node-rank", "0")
        try:
            ids = random_prompt(33, seed=5)
            assert gen(node0, ids)["output_ids"] == gen(server, ids)["output_ids"]
            with pytest.raises(requests.ConnectionError):
                requests.get(f"http://127.0.0.1:{node1_port}/health", timeout=5)
        finally:
            node0.stop()
        assert node1.wait(timeout=60) != 0
    finally:
        if node1.poll() is None:
            node1.kill()
