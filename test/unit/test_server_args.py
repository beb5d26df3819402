"""ServerArgs: defaults, aliases, rejection of bad flags and values, and offline model resolution."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from sgl_inkling.model_resolution import ModelNotFoundError, hf_hub_cache_dir, resolve_model_path
from sgl_inkling.server_args import ServerArgs, ServerArgsError, parse_server_args


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def _exit_code_and_stderr(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        parse_server_args(argv)
    return info.value.code, capsys.readouterr().err


# --- defaults and aliases -------------------------------------------------------------------


def test_defaults_on_cpu(no_cuda):
    a = parse_server_args([])
    assert a.model_path is None and a.served_model_name == "inkling-tiny"
    assert (a.host, a.port, a.tp_size) == ("127.0.0.1", 30000, 1)
    assert a.resolved_device() == "cpu" and a.resolved_dtype() == torch.float32
    assert a.chunked_prefill_size == 512 and a.mem_fraction_static is None
    assert a.max_prefill_tokens == 16384 and a.max_payload_bytes == 8 * 1024 * 1024
    assert a.stream_interval == 1 and a.watchdog_timeout == 300
    assert a.schedule_policy == "lpm" and a.attention_backend == "torch_native"
    assert not a.disable_radix_cache and not a.enable_metrics and not a.skip_server_warmup


def test_defaults_on_cuda(fake_cuda):
    a = parse_server_args([])
    assert a.resolved_device() == "cuda" and a.resolved_dtype() == torch.bfloat16
    assert a.chunked_prefill_size == 8192 and a.mem_fraction_static == 0.85


def test_explicit_values_survive_defaults(fake_cuda):
    a = parse_server_args(["--chunked-prefill-size", "-1", "--mem-fraction-static", "0.5", "--dtype", "float32"])
    assert a.chunked_prefill_size == -1 and a.mem_fraction_static == 0.5
    assert a.resolved_dtype() == torch.float32


def test_aliases_and_served_name(no_cuda):
    a = parse_server_args(["--model", "org/name", "--tp", "1"])
    assert a.model_path == "org/name" and a.tp_size == 1
    assert a.served_model_name == "org/name"  # the value as given, not a resolved path
    assert parse_server_args(["--model-path", "x", "--served-model-name", "y"]).served_model_name == "y"


def test_flags_reach_fields(no_cuda):
    a = parse_server_args([
        "--port", "8000", "--reasoning-parser", "inkling", "--tool-call-parser", "inkling",
        "--disable-radix-cache", "--trust-remote-code", "--schedule-policy", "fcfs", "--api-key", "k",
        "--load-format", "dummy", "--random-seed", "7", "--log-level", "debug", "--enable-metrics",
    ])
    assert a.port == 8000 and a.reasoning_parser == "inkling" and a.tool_call_parser == "inkling"
    assert a.disable_radix_cache and a.trust_remote_code and a.enable_metrics
    assert (a.schedule_policy, a.api_key, a.load_format, a.random_seed, a.log_level) == (
        "fcfs", "k", "dummy", 7, "debug")


# --- argparse-level rejection -------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--speculative-algorithm", "--enable-dp-attention", "--grammar-backend"])
def test_unknown_flag_exits_2(flag, capsys):
    code, err = _exit_code_and_stderr([flag, "1"], capsys)
    assert code == 2 and flag in err


def test_no_abbreviations(capsys):
    code, err = _exit_code_and_stderr(["--model-p", "x"], capsys)  # a prefix of --model-path
    assert code == 2 and "--model-p" in err


def test_bad_choice_exits_2(capsys):
    code, err = _exit_code_and_stderr(["--dtype", "int8"], capsys)
    assert code == 2 and "--dtype" in err


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, flag, words",
    [
        (["--port", "0"], "--port", "65535"),
        (["--port", "70000"], "--port", "65535"),
        (["--mem-fraction-static", "0"], "--mem-fraction-static", "(0, 1)"),
        (["--mem-fraction-static", "1.0"], "--mem-fraction-static", "(0, 1)"),
        (["--tp-size", "0"], "--tp-size", ">= 1"),
        (["--tp", "2", "--ep-size", "3"], "--ep-size", "divide"),
        (["--tp", "4", "--nnodes", "3"], "--nnodes", "divide"),
        (["--tp", "2", "--nnodes", "2"], "--dist-init-addr", "required"),
        (["--tp", "2", "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1"], "--node-rank", "0..1"),
        (["--dist-init-addr", "no-port"], "--dist-init-addr", "host:port"),
        (["--dtype", "float16"], "--dtype", "bfloat16"),
        (["--chunked-prefill-size", "0"], "--chunked-prefill-size", "-1"),
        (["--chunked-prefill-size", "-2"], "--chunked-prefill-size", "-1"),
        (["--context-length", "0"], "--context-length", ">= 1"),
        (["--max-running-requests", "0"], "--max-running-requests", "positive"),
        (["--max-total-tokens", "-5"], "--max-total-tokens", "positive"),
        (["--max-prefill-tokens", "0"], "--max-prefill-tokens", "positive"),
        (["--stream-interval", "0"], "--stream-interval", "positive"),
        (["--max-payload-bytes", "0"], "--max-payload-bytes", "positive"),
        (["--watchdog-timeout", "0"], "--watchdog-timeout", "positive"),
        (["--chunked-prefill-size", "4096", "--max-prefill-tokens", "1024"], "--max-prefill-tokens",
         "--chunked-prefill-size"),
        (["--device", "cuda"], "--device", "CUDA"),
    ],
)
def test_invalid_values_name_the_flag(argv, flag, words, no_cuda, capsys):
    code, err = _exit_code_and_stderr(argv, capsys)
    assert code == 2 and flag in err and words in err


def test_parallel_flags_as_sglang(no_cuda):
    a = parse_server_args(
        ["--tp", "4", "--ep", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"]
    )
    assert (a.tp_size, a.ep_size, a.nnodes, a.node_rank, a.dist_init_addr) == (4, 2, 2, 1, "10.0.0.1:5000")


def test_no_chunking_lifts_prefill_budget_check(no_cuda):
    a = parse_server_args(["--chunked-prefill-size", "-1", "--max-prefill-tokens", "64"])
    assert a.chunked_prefill_size == -1 and a.max_prefill_tokens == 64


def test_check_raises_for_direct_construction(no_cuda):
    with pytest.raises(ServerArgsError, match="--schedule-policy"):
        ServerArgs(schedule_policy="random").check()
    with pytest.raises(ServerArgsError, match="--ep-size"):
        ServerArgs(tp_size=2, ep_size=4).check()
    assert isinstance(ServerArgsError("x"), ValueError)


# --- model resolution -----------------------------------------------------------------------


def test_default_model_is_tiny_checkpoint():
    for name in (None, "inkling-tiny"):
        path = resolve_model_path(name)
        assert (path / "config.json").is_file() and "inkling-tiny" in path.name


def test_local_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == tmp_path.resolve()


def test_local_directory_without_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json") as info:
        resolve_model_path(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def _snapshot(cache, repo: str, rev: str, config: dict | None = None):
    snap = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / rev
    snap.mkdir(parents=True)
    if config is not None:
        (snap / "config.json").write_text(json.dumps(config))
    return snap


def test_hf_cache_prefers_refs_main(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    main = _snapshot(cache, "org/name", "aaa", {"rev": "main"})
    newer = _snapshot(cache, "org/name", "bbb", {"rev": "other"})
    os.utime(newer, (time.time() + 100, time.time() + 100))  # newer, but not what refs/main names
    (cache / "models--org--name" / "refs").mkdir()
    (cache / "models--org--name" / "refs" / "main").write_text("aaa\n")
    assert resolve_model_path("org/name") == main


def test_hf_cache_without_refs_takes_complete_snapshot(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    complete = _snapshot(cache, "org/name", "aaa", {})
    _snapshot(cache, "org/name", "bbb", None)  # partial download: no config.json
    assert resolve_model_path("org/name") == complete


def test_hf_home_is_respected(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hf_hub_cache_dir() == tmp_path / "hub"
    snap = _snapshot(tmp_path / "hub", "org/name", "ccc", {})
    assert resolve_model_path("org/name") == snap


def test_absent_repo_lists_where_it_looked(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path("org/missing")
    msg = str(info.value)
    assert str(cache) in msg and "models--org--missing" in msg
    assert "never downloads" in msg and "huggingface-cli download org/missing" in msg


def test_repo_with_stale_ref_and_no_snapshots(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    refs = cache / "models--org--name" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("deadbeef")
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path("org/name")
    assert "deadbeef" in str(info.value) and "0 snapshot(s)" in str(info.value)


def test_missing_absolute_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such local directory"):
        resolve_model_path(str(tmp_path / "nope" / "deeper" / "x"))
