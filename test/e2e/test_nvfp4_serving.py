"""`--model-path inkling-tiny-nvfp4` (the Inkling-NVFP4 layout) serves on CPU: greedy output equals a
cold in-process run of the same checkpoint; `--quantization` values that contradict the checkpoint or
name another format stop the server at start-up with the reason."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from sgl_inkling.model_executor.model_loader import load_model
from test.unit.helpers import random_prompt, seq_runner

from .server import ServerProcess

SP = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}


@pytest.fixture(scope="module")
def nvfp4_server():
    s = ServerProcess("--skip-server-warmup", "--model-path", "inkling-tiny-nvfp4", "--quantization", "modelopt_fp4")
    yield s
    s.stop()


def test_serves_greedy_equal_to_a_cold_run(nvfp4_server):
    from sgl_inkling.models.inkling.tiny_nvfp4 import ensure_tiny_nvfp4_checkpoint

    runner = seq_runner(load_model(ensure_tiny_nvfp4_checkpoint(), torch.float32, "cpu", progress=False))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the server's ranks run one thread each too; keeps the loaded box fast
    try:
        for n, seed in ((12, 5), (45, 6)):
            ids = random_prompt(n, seed)
            got = nvfp4_server.generate(input_ids=ids, sampling_params=SP)["output_ids"]
            assert got == runner.greedy(ids, SP["max_new_tokens"])
    finally:
        torch.set_num_threads(threads)
    assert nvfp4_server.get("/get_server_info").json()["quantization"] == "modelopt_fp4"
    nvfp4_server.wait_idle_baseline()


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--quantization", "modelopt_fp4"], "--quantization modelopt_fp4: the checkpoint is not quantized"),
        (["--quantization", "fp8"], "--quantization: 'fp8' is not supported"),
    ],
    ids=["contradicts-bf16-checkpoint", "other-format"],
)
def test_bad_quantization_flag_stops_start_up(flags, message):
    cmd = [sys.executable, "-m", "sglang.launch_server", "--skip-server-warmup", "--log-level", "error", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
