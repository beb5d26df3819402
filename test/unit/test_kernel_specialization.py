"""Kernels compile once per shape of the model, not once per kind of prompt length: Triton keys a
compiled variant on each integer argument's divisibility by 16 (and on the value 1) unless told not
to, so token counts must not be specialised on. Otherwise the first short extension after cold
prefills of multiple-of-16 lengths (a cached prompt's first request) pays a compile on the GPU."""

from __future__ import annotations

import pytest

import sgl_inkling_kernels._triton  # noqa: F401  # first: it turns the interpreter on (CPU) before Triton loads

triton = pytest.importorskip("triton")

from triton.backends.compiler import BaseBackend  # noqa: E402
from triton.runtime.jit import JITFunction, native_specialize_impl  # noqa: E402

from sgl_inkling_kernels import fused_moe  # noqa: E402

TOP_K = 6  # Inkling's experts per token: num_pairs = tokens * 6


def as_jit(kernel) -> JITFunction:
    """The compiled-mode view of a kernel (on the CPU the module holds the interpreter's wrapper)."""
    if isinstance(kernel, JITFunction):
        return kernel
    opts = {k: v for k, v in kernel.kwargs.items() if k.startswith("do_not_specialize")}
    return JITFunction(kernel.fn, **opts)


def compile_key(kernel, name: str, value: int):
    """The part of the kernel's compile key that an integer argument contributes (Triton's rule)."""
    kp = next(p for p in as_jit(kernel).params if p.name == name)
    return native_specialize_impl(
        BaseBackend, value, kp.is_const, not kp.do_not_specialize, not kp.do_not_specialize_on_alignment
    )


def test_the_rule_would_split_token_counts_into_variants():
    assert native_specialize_impl(BaseBackend, 16 * TOP_K, False, True, True) != native_specialize_impl(
        BaseBackend, 10 * TOP_K, False, True, True
    )


@pytest.mark.parametrize(
    "kernel", ["_moe_up_kernel", "_moe_down_kernel", "_moe_align_small_kernel", "_moe_align_sort_kernel"]
)
def test_moe_kernels_key_the_same_for_every_token_count(kernel):
    k = getattr(fused_moe, kernel)
    keys = {compile_key(k, "num_pairs", t * TOP_K) for t in range(1, 300)}
    assert len(keys) == 1, keys
    if kernel == "_moe_align_small_kernel":
        assert len({compile_key(k, "max_blocks", b) for b in range(1, 130)}) == 1
    if kernel == "_moe_align_sort_kernel":  # one variant for every layout, which one warm-up batch compiles
        for name in ("max_blocks", "block_m", "num_experts"):
            assert len({compile_key(k, name, v) for v in range(1, 600)}) == 1, name


@pytest.mark.parametrize("module, kernel", [("fused_moe_nvfp4", "_up_kernel"), ("fused_moe_nvfp4", "_down_kernel"),
                                            ("moe_nvfp4_gemv", "_up_gemv_kernel"),
                                            ("moe_nvfp4_gemv", "_down_gemv_kernel")])  # fmt: skip
def test_nvfp4_moe_kernels_key_the_same_for_every_token_count(module, kernel):
    import importlib

    k = getattr(importlib.import_module(f"sgl_inkling_kernels.{module}"), kernel)
    # Per token: top-k pairs, one token, and (2 sinks) up to two sink blocks.
    for name, per_token in (("num_pairs", TOP_K), ("T", 1), ("n_sink_blocks", 2)):
        assert len({compile_key(k, name, t * per_token) for t in range(1, 300)}) == 1, name


def test_router_kernels_key_the_same_for_every_token_count():
    from sgl_inkling_kernels import router

    n = 258  # Inkling's routed + sink experts: logits per token
    k = router._route_align_kernel
    for name, per_token in (("T", 1), ("stride_lp", n), ("max_blocks", TOP_K + 1)):
        assert len({compile_key(k, name, t * per_token) for t in range(1, 11)}) == 1, name
    assert len({compile_key(router._router_kernel, "stride_lp", t * n) for t in range(1, 300)}) == 1
