"""The decode fusion kernels and decode attention compile for Hopper (sm_90) on a machine without a GPU, at Inkling's
shapes and in both dtypes: the interpreter tests cover their numbers, this covers their build
(the interpreter accepts kernels the compiler rejects)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (for the other test files)
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_fused_decode_kernels_compile_for_hopper():
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, str(ROOT / "test/kernels/gpu_compile.py")], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok ") == run.stdout.count("\n")
