"""ServerArgs: defaults, aliases, rejection of bad flags and values, and offline model resolution."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import huggingface_hub
import pytest
import torch

from sgl_inkling.model_resolution import ModelNotFoundError, resolve_model_path
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


@pytest.mark.parametrize("flag", ["--enable-hierarchical-cache", "--disaggregation-mode", "--enable-lora-overlap"])
def test_unknown_flag_exits_2(flag, capsys):
    code, err = _exit_code_and_stderr([flag, "1"], capsys)
    assert code == 2 and f"unrecognized arguments: {flag}" in err


def test_no_abbreviations(capsys):
    code, err = _exit_code_and_stderr(["--model-p", "x"], capsys)  # a prefix of --model-path
    assert code == 2 and "--model-p" in err


def test_bad_choice_exits_2(capsys):
    code, err = _exit_code_and_stderr(["--dtype", "int8"], capsys)
    assert code == 2 and "--dtype" in err


# --- upstream flags: honoured, or refused at start with the reason -------------------------


def test_cuda_graph_bs_sets_the_buckets_and_their_largest(no_cuda, capsys):
    a = parse_server_args(["--cuda-graph-bs", "8", "1", "4", "4", "64"])
    assert a.cuda_graph_bs == [1, 4, 8, 64] and a.cuda_graph_max_bs == 64
    assert parse_server_args([]).cuda_graph_bs is None and parse_server_args([]).cuda_graph_max_bs == 128
    code, err = _exit_code_and_stderr(["--cuda-graph-bs", "0", "8"], capsys)
    assert code == 2 and "error: --cuda-graph-bs: batch sizes must be >= 1" in err
    code, err = _exit_code_and_stderr(["--cuda-graph-bs", "8", "--disable-cuda-graph"], capsys)
    assert code == 2 and "error: --cuda-graph-bs:" in err and "--disable-cuda-graph" in err
    with pytest.raises(ServerArgsError, match="--cuda-graph-bs"):
        ServerArgs(cuda_graph_bs=[]).check()
    code, err = _exit_code_and_stderr(["--cuda-graph-bs", "1", "8", "--cuda-graph-max-bs", "32"], capsys)
    assert code == 2 and "error: --cuda-graph-bs:" in err and "--cuda-graph-max-bs 32" in err
    assert parse_server_args(["--cuda-graph-bs", "1", "8", "--cuda-graph-max-bs", "8"]).cuda_graph_max_bs == 8



def test_upstream_names_and_neutral_values_accepted(no_cuda):
    a = parse_server_args([
        "--kv-cache-dtype", "auto", "--page-size", "1", "--moe-runner-backend", "auto",
        "--cuda-graph-max-bs-decode", "24", "--dtype", "float", "--log-requests", "--log-requests-level", "0",
        "--enable-cache-report",
    ])  # fmt: skip
    assert (a.kv_cache_dtype, a.page_size, a.moe_runner_backend, a.cuda_graph_max_bs) == ("auto", 1, "auto", 24)
    assert a.resolved_dtype() == torch.float32 and a.log_requests and a.log_requests_level == 0
    assert a.enable_cache_report
    b = parse_server_args(["--kv-cache-dtype", "bf16", "--dtype", "bfloat16"])
    assert b.kv_cache_dtype == "bf16" and b.resolved_dtype() == torch.bfloat16


def test_bf16_kv_with_auto_dtype_on_cuda(fake_cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert parse_server_args(["--kv-cache-dtype", "bfloat16", "--moe-runner-backend", "triton"]).kv_cache_dtype == "bfloat16"


@pytest.mark.parametrize(
    "argv, flag, words",
    [
        (["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype", "bfloat16 keys and values"),
        (["--kv-cache-dtype", "fp8_e5m2"], "--kv-cache-dtype", "not supported"),
        (["--kv-cache-dtype", "bf16"], "--kv-cache-dtype", "--dtype bfloat16"),  # cpu: float32 model
        (["--page-size", "16"], "--page-size", "token-granular"),
        (["--chat-template", "x.jinja"], "--chat-template", "tml-renderers"),
        (["--enable-torch-compile"], "--enable-torch-compile", "not implemented"),
        (["--enable-lora"], "--enable-lora", "LoRA"),
        (["--lora-paths", "a=/x"], "--lora-paths", "LoRA"),
        (["--moe-runner-backend", "deep_gemm"], "--moe-runner-backend", "use auto"),
        (["--moe-runner-backend", "triton"], "--moe-runner-backend", "cuda only"),
        (["--enable-dp-attention"], "--enable-dp-attention", "--dp-size"),
        (["--dtype", "half"], "--dtype", "bfloat16"),
    ],
)
def test_upstream_flags_refused_with_reason(argv, flag, words, no_cuda, capsys):
    code, err = _exit_code_and_stderr(argv, capsys)
    assert code == 2 and f"error: {flag}:" in err and words in err


def test_refusals_hold_for_direct_construction(no_cuda):
    with pytest.raises(ServerArgsError, match="--page-size"):
        ServerArgs(page_size=64).check()
    with pytest.raises(ServerArgsError, match="--log-requests-level"):
        ServerArgs(log_requests_level=7).check()


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
        (["--speculative-draft-model-quantization", "fp8"], "--speculative-draft-model-quantization",
         "--speculative-algorithm"),
        (["--speculative-algorithm", "MTP", "--speculative-draft-model-quantization", "modelopt_fp4"],
         "--speculative-draft-model-quantization", "fp8"),
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


def test_revision_and_download_dir_refused_for_local_models(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="--revision applies to a hub repo id"):
        resolve_model_path(str(tmp_path), revision="main")
    with pytest.raises(ValueError, match="--download-dir applies to a hub repo id"):
        resolve_model_path(None, download_dir=str(tmp_path))


def _commit(seed: str) -> str:
    return hashlib.sha1(seed.encode()).hexdigest()  # 40 hex digits, as a git commit id


def _cached_snapshot(cache, repo: str, commit: str, refs: tuple[str, ...] = (), config: dict | None = None):
    """huggingface_hub's cache layout, built by hand: blobs by content hash, snapshot files linking
    to them, refs/<name> holding a commit id."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    if config is not None:
        data = json.dumps(config).encode()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / "config.json").symlink_to(os.path.relpath(blob, snap))
    for ref in refs:
        (root / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snap


def test_hub_cache_follows_refs_main(tmp_path):
    cache = tmp_path / "hub"
    main = _cached_snapshot(cache, "org/name", _commit("a"), ("main",), {"rev": "main"})
    _cached_snapshot(cache, "org/name", _commit("b"), ("dev",), {"rev": "dev"})
    assert resolve_model_path("org/name", download_dir=str(cache)) == main
    assert json.loads((main / "config.json").read_text()) == {"rev": "main"}


def test_revision_picks_branch_tag_or_commit(tmp_path):
    cache = tmp_path / "hub"
    _cached_snapshot(cache, "org/name", _commit("a"), ("main",), {"rev": "main"})
    dev = _cached_snapshot(cache, "org/name", _commit("b"), ("dev", "tags/v1"), {"rev": "dev"})
    pinned = _cached_snapshot(cache, "org/name", _commit("c"), (), {"rev": "pinned"})
    assert resolve_model_path("org/name", revision="dev", download_dir=str(cache)) == dev
    assert resolve_model_path("org/name", revision="tags/v1", download_dir=str(cache)) == dev
    assert resolve_model_path("org/name", revision=_commit("c"), download_dir=str(cache)) == pinned


def test_unknown_revision_lists_the_cached_snapshots(tmp_path):
    cache = tmp_path / "hub"
    _cached_snapshot(cache, "org/name", _commit("a"), ("main",), {})
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path("org/name", revision="nope", download_dir=str(cache))
    msg = str(info.value)
    assert "revision 'nope'" in msg and _commit("a") in msg and "(main)" in msg
    assert "--revision nope" in msg and "never downloads" in msg


def test_snapshot_without_refs_needs_its_revision(tmp_path):
    cache = tmp_path / "hub"
    _cached_snapshot(cache, "org/name", _commit("a"), (), {})  # a download pinned to a commit
    with pytest.raises(ModelNotFoundError, match="revision 'main'"):
        resolve_model_path("org/name", download_dir=str(cache))
    assert resolve_model_path("org/name", revision=_commit("a"), download_dir=str(cache)).name == _commit("a")


def test_snapshot_without_config_is_refused(tmp_path):
    cache = tmp_path / "hub"
    _cached_snapshot(cache, "org/name", _commit("a"), ("main",), None)
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model_path("org/name", download_dir=str(cache))


def test_download_dir_is_the_cache_looked_in(tmp_path, monkeypatch):
    default, other = tmp_path / "default", tmp_path / "other"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(default))
    snap = _cached_snapshot(other, "org/name", _commit("a"), ("main",), {})
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path("org/name")
    assert str(default) in str(info.value) and "huggingface-cli download org/name" in str(info.value)
    assert resolve_model_path("org/name", download_dir=str(other)) == snap


def test_hf_home_is_respected(tmp_path):
    # huggingface_hub reads HF_HOME when it is imported, so a fresh process shows the real behaviour.
    snap = _cached_snapshot(tmp_path / "hub", "org/name", _commit("a"), ("main",), {})
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    code = "from sgl_inkling.model_resolution import resolve_model_path as r; print(r('org/name'))"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "HF_HOME": str(tmp_path)},
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == str(snap)


def test_revision_and_download_dir_flags_reach_fields(no_cuda):
    a = parse_server_args(["--model", "org/name", "--revision", "dev", "--download-dir", "/d"])
    assert (a.revision, a.download_dir) == ("dev", "/d")


def test_missing_absolute_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such local directory"):
        resolve_model_path(str(tmp_path / "nope" / "deeper" / "x"))


def test_draft_quantization_reaches_its_field_and_is_checked_when_constructed(no_cuda):
    args = parse_server_args(["--speculative-algorithm", "MTP", "--speculative-draft-model-quantization", "fp8"])
    assert args.speculative_draft_model_quantization == "fp8"
    ServerArgs(speculative_draft_model_quantization="unquant").check()  # the neutral value needs no MTP
    with pytest.raises(ServerArgsError, match="--speculative-draft-model-quantization"):
        ServerArgs(speculative_algorithm="MTP", speculative_draft_model_quantization="int4").check()
