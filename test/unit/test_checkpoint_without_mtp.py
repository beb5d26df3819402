"""Issue 18 item 11: a checkpoint saved by transformers' Inkling port (its config declares MTP
layers; the port never writes `model.mtp.*`) serves without MTP, and asking it for speculative
decoding fails at start naming what is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from sgl_inkling.model_executor.model_loader import load_model
from sgl_inkling.models.inkling.config import InklingConfig
from sgl_inkling.models.inkling.weights import WeightLoadError

from .helpers import prompt_logits, random_prompt, seq_runner


@pytest.fixture(scope="module")
def hf_saved(tmp_path_factory, hf_model):
    path = tmp_path_factory.mktemp("hf-saved")
    hf_model.save_pretrained(path)
    with safe_open(path / "model.safetensors", framework="pt") as f:
        assert not any(k.startswith("model.mtp.") for k in f.keys())
    assert InklingConfig.from_file(path).text.mtp is not None  # the config still declares MTP
    return path


def test_transformers_saved_checkpoint_loads_without_mtp(hf_saved, tiny_model, caplog):
    with caplog.at_level("WARNING"):
        model = load_model(hf_saved, progress=False)
    assert model.num_mtp_layers == 0 and model.model.mtp is None
    assert "MTP disabled" in caplog.text
    prompt = random_prompt(24, seed=8)  # the trunk is the same model as the original checkpoint's
    assert torch.equal(prompt_logits(seq_runner(model), prompt), prompt_logits(seq_runner(tiny_model), prompt))


def test_speculative_decoding_on_it_is_refused_naming_the_tensors(hf_saved):
    with pytest.raises(WeightLoadError, match=r"--speculative-algorithm MTP.*model\.mtp\.\*"):
        load_model(hf_saved, progress=False, need_mtp=True)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(hf_saved),
           "--speculative-algorithm", "MTP", "--port", "1", "--log-level", "error"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert run.returncode != 0
    assert "model.mtp.*" in run.stderr and "--speculative-algorithm" in run.stderr, run.stderr[-2000:]
