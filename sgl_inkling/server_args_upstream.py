"""Upstream SGLang flags people type every day that only make sense at one value here.

Each is parsed under upstream's name, accepted at its neutral value, and any other value stops the
server at start with the reason, so nobody believes a setting took effect when it did not.
"""

from __future__ import annotations

import argparse

import torch

KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e5m2", "fp8_e4m3", "mxfp8", "nvfp4", "fp4_e2m1")
MOE_RUNNER_BACKENDS = ("auto", "triton", "triton_kernel", "deep_gemm", "cutlass", "flashinfer_cutlass",
                       "flashinfer_trtllm", "flashinfer_mxfp4", "marlin", "aiter")  # fmt: skip


def add_upstream_cli_args(parser: argparse.ArgumentParser, d) -> None:
    g = parser.add_argument_group("upstream flags with one supported value")
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=d.kv_cache_dtype,
                   help="auto: the model's dtype. bf16/bfloat16 need --dtype bfloat16; fp8/fp4 KV is refused.")
    g.add_argument("--page-size", type=int, default=d.page_size,
                   help="Only 1: the KV pools and the prefix cache are token-granular.")
    g.add_argument("--chat-template", default=d.chat_template,
                   help="Refused: Inkling's TMLv0 chat format is rendered by tml-renderers.")
    g.add_argument("--enable-torch-compile", action="store_true", help="Refused (not implemented).")
    g.add_argument("--enable-lora", action="store_true", help="Refused: LoRA adapters are not supported.")
    g.add_argument("--lora-paths", nargs="*", default=d.lora_paths, help="Refused, as --enable-lora.")
    g.add_argument("--moe-runner-backend", choices=MOE_RUNNER_BACKENDS, default=d.moe_runner_backend,
                   help="auto (Triton kernels on cuda, the torch reference on cpu); triton on cuda.")
    g.add_argument("--enable-dp-attention", action="store_true",
                   help="Refused: use --dp-size for data-parallel replicas.")  # fmt: skip


def check_upstream_flags(a, fail) -> None:
    """Refuse every non-neutral value with the reason (`fail(flag, why)` raises); `a` is ServerArgs."""
    device = a.resolved_device()
    if a.log_requests_level not in (0, 1, 2, 3):
        fail("--log-requests-level", f"must be 0, 1, 2 or 3, got {a.log_requests_level}")
    kv = a.kv_cache_dtype
    if kv not in KV_CACHE_DTYPES:
        fail("--kv-cache-dtype", f"{kv!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    if kv.startswith(("fp8", "mxfp8", "nvfp4", "fp4")):
        fail("--kv-cache-dtype", f"{kv} is not supported: the KV cache holds the model's dtype and the "
                                 "attention kernels read bfloat16 keys and values (no quantized-KV scales); "
                                 "use auto")  # fmt: skip
    if kv in ("bf16", "bfloat16") and a.resolved_dtype() != torch.bfloat16:
        fail("--kv-cache-dtype", f"{kv} needs a bfloat16 model: the KV cache is stored in the model's dtype "
                                 "(use --dtype bfloat16, or --kv-cache-dtype auto)")  # fmt: skip
    if a.page_size not in (None, 1):
        fail("--page-size", f"only 1 is supported, got {a.page_size}: the KV pools and the radix cache are "
                            "token-granular, so a prefix is matched to the token rather than the page")  # fmt: skip
    if a.chat_template is not None:
        fail("--chat-template", "not supported: Inkling's TMLv0 chat format (thinking, tool calls, media) is "
                                "rendered by tml-renderers, the model's own renderer; a template cannot replace "
                                "it. Control it per request with chat_template_kwargs / reasoning_effort")  # fmt: skip
    if a.enable_torch_compile:
        fail("--enable-torch-compile", "not supported: the model runs Triton kernels, decode is replayed from "
                                       "CUDA graphs; torch.compile of the model is not implemented")  # fmt: skip
    if a.enable_lora or a.lora_paths:
        flag = "--enable-lora" if a.enable_lora else "--lora-paths"
        fail(flag, "LoRA adapters are not supported for Inkling (no adapter-aware expert or attention kernels)")
    backend = a.moe_runner_backend
    if backend not in MOE_RUNNER_BACKENDS:
        fail("--moe-runner-backend", f"{backend!r} is not one of {', '.join(MOE_RUNNER_BACKENDS)}")
    if backend == "triton" and device != "cuda":
        fail("--moe-runner-backend", "triton runs on cuda only; on cpu the MoE runs the torch reference (use auto)")
    if backend not in ("auto", "triton"):
        fail("--moe-runner-backend", f"{backend} is not implemented: Inkling's MoE (expert sinks, route scale) "
                                     "runs its own Triton kernels; use auto")  # fmt: skip
    if a.enable_dp_attention:
        fail("--enable-dp-attention", "DP attention is not implemented; --dp-size N runs N data-parallel "
                                      "replicas, each with its own tensor-parallel group")  # fmt: skip
