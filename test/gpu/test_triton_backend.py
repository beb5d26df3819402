"""The Triton attention backend on CUDA through the real inkling-tiny model.

fp32 on the GPU must match torch_native (GPU and CPU) tightly and give the same greedy tokens;
bf16 is compared with teacher forcing (same inputs) and its tolerance is printed for the report.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from sgl_inkling_kernels._triton import kernel_dispatch  # noqa: E402
from test.kernels.backend_scenario import run_scenario  # noqa: E402


def _load(tiny_path, dtype):
    from sgl_inkling.model_executor.model_loader import load_model

    return load_model(tiny_path, dtype, "cuda", progress=False)


def test_fp32_triton_matches_torch_native(tiny_path, tiny_model):
    model = _load(tiny_path, torch.float32)
    got, got_tokens = run_scenario(model, "triton")
    gpu_ref, gpu_tokens = run_scenario(model, "torch_native")
    cpu_ref, cpu_tokens = run_scenario(tiny_model, "torch_native")
    assert got_tokens == gpu_tokens == cpu_tokens
    worst = max((g - w).abs().max().item() for g, w in zip(got, cpu_ref))
    print(f"\nfp32 triton (cuda) vs torch_native (cpu): max |logit diff| = {worst:.2e}")
    for g, w in zip(got, gpu_ref):
        torch.testing.assert_close(g, w, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("kernels", [False, True], ids=["attention-only", "all-kernels"])
def test_bf16_triton_tracks_fp32_reference(tiny_path, tiny_model, kernels):
    import contextlib

    cpu_ref, cpu_tokens = run_scenario(tiny_model, "torch_native")
    model = _load(tiny_path, torch.bfloat16)
    with contextlib.nullcontext() if kernels else kernel_dispatch(False):
        got, _ = run_scenario(model, "triton", forced=cpu_tokens)
    native, _ = run_scenario(model, "torch_native", forced=cpu_tokens)
    diffs = [(g.float() - w).abs().max().item() for g, w in zip(got, cpu_ref)]
    native_diffs = [(g.float() - w).abs().max().item() for g, w in zip(native, cpu_ref)]
    scale = max(w.abs().max().item() for w in cpu_ref)
    rows = sum(w.shape[0] for w in cpu_ref)
    agree = sum(int((g.float().argmax(-1) == w.argmax(-1)).sum()) for g, w in zip(got, cpu_ref))
    agree_native = sum(int((g.float().argmax(-1) == w.argmax(-1)).sum()) for g, w in zip(native, cpu_ref))
    what = "all kernels" if kernels else "attention only"
    print(
        f"\nbf16 ({what}) vs fp32 CPU: max |logit diff| triton {max(diffs):.3f}, "
        f"torch_native {max(native_diffs):.3f}, logit scale {scale:.2f}; "
        f"argmax agrees at {agree}/{rows} positions (torch_native bf16: {agree_native})"
    )
    # The Triton backend must not be meaningfully worse than bf16 through the reference backend.
    assert max(diffs) <= 2.0 * max(native_diffs) + 0.05 * scale


@pytest.mark.parametrize("kernels", [False, True], ids=["attention-only", "all-kernels"])
def test_greedy_gpu_equals_cpu_fp32(tiny_path, tiny_model, kernels):
    """Greedy tokens on the GPU (triton backend, with the model's other kernels or its torch references) equal the CPU eager path."""
    import contextlib

    from sgl_inkling.model_executor.model_runner import ModelRunner
    from sgl_inkling.model_executor.seq_runner import SeqRunner
    from test.kernels.backend_scenario import random_tokens

    prompt = random_tokens(40, 9)
    cpu = SeqRunner(ModelRunner(tiny_model, 4, 1024, 2048)).greedy(prompt, 24)
    gpu_model = _load(tiny_path, torch.float32)
    with contextlib.nullcontext() if kernels else kernel_dispatch(False):
        gpu = SeqRunner(ModelRunner(gpu_model, 4, 1024, 2048, attention_backend="triton")).greedy(prompt, 24)
        scenario, tokens = run_scenario(gpu_model, "triton")
    assert gpu == cpu
    want, want_tokens = run_scenario(tiny_model, "torch_native")
    assert tokens == want_tokens
    worst = max((g - w).abs().max().item() for g, w in zip(scenario, want))
    print(f"\nfp32 cuda ({'all kernels' if kernels else 'attention only'}) vs cpu eager: max |logit diff| {worst:.2e}")
    for g, w in zip(scenario, want):
        torch.testing.assert_close(g, w, atol=2e-3, rtol=2e-3)
