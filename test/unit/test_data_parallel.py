"""The data-parallel controller's pure parts: dispatch, merged replica state, dp-rank validation."""

from __future__ import annotations

import pytest

from sgl_inkling.managers import io_struct as io
from sgl_inkling.managers.data_parallel_controller import (
    LoadBalancer,
    check_dp_rank,
    merge_flush,
    merge_states,
)
from sgl_inkling.server_args import ServerArgsError, parse_server_args


def test_round_robin_cycles_and_pinned_requests_do_not_shift_it():
    lb = LoadBalancer(3, "round_robin")
    assert [lb.assign(f"r{k}") for k in range(4)] == [0, 1, 2, 0]
    assert lb.assign("pinned", pinned=2) == 2
    assert lb.assign("next") == 1
    assert lb.in_flight == [2, 2, 2]


def test_shortest_queue_follows_in_flight_counts():
    lb = LoadBalancer(2, "shortest_queue")
    assert [lb.assign(r) for r in ("a", "b", "c")] == [0, 1, 0]  # ties alternate
    lb.finished("a")
    lb.finished("c")
    assert lb.in_flight == [0, 1]
    assert lb.assign("d") == 0 and lb.assign("e") in (0, 1)
    lb.finished("unknown")  # a finish the balancer never saw changes nothing
    assert sum(lb.in_flight) == 3 and set(lb.owner) == {"b", "d", "e"}


def test_merge_states_sums_capacity_and_keeps_model_facts():
    a = {"num_finished_reqs": 3, "full_kv_total": 100, "full_kv_available": 90, "context_len": 4096,
         "vocab_size": 50, "sconv_checkpoint_bytes": 8, "device": "cpu"}  # fmt: skip
    b = {**a, "num_finished_reqs": 5, "full_kv_available": 100}
    m = merge_states([a, b])
    assert m["num_finished_reqs"] == 8 and m["full_kv_total"] == 200 and m["full_kv_available"] == 190
    assert (m["context_len"], m["vocab_size"], m["sconv_checkpoint_bytes"], m["device"]) == (
        4096,
        50,
        8,
        "cpu",
    )
    assert m["dp_size"] == 2
    assert [(r["dp_rank"], r["num_finished_reqs"]) for r in m["replicas"]] == [(0, 3), (1, 5)]


def test_merge_flush_fails_if_any_replica_failed():
    assert merge_flush([io.FlushCacheResp(True), io.FlushCacheResp(True)]).success
    bad = merge_flush([io.FlushCacheResp(True), io.FlushCacheResp(False, "busy")])
    assert not bad.success and bad.message == "replica 1: busy"


def test_check_dp_rank():
    assert check_dp_rank(None, 1) is None and check_dp_rank(1, 2) == 1
    for bad in (2, -1, True, "0", 1.0):
        with pytest.raises(io.RequestError, match="data_parallel_rank"):
            check_dp_rank(bad, 2)


def test_dp_flags():
    a = parse_server_args(["--dp-size", "2", "--load-balance-method", "shortest_queue", "--device", "cpu"])
    assert (a.dp_size, a.load_balance_method) == (2, "shortest_queue")
    assert parse_server_args(["--dp", "3", "--device", "cpu"]).dp_size == 3
    with pytest.raises(ServerArgsError, match="--dp-size"):
        a.dp_size = 0
        a.check()
