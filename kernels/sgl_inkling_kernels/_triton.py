"""Optional Triton import shared by every kernel module.

The CPU runtime must not need Triton (torch CPU wheels do not carry it), so a missing Triton
leaves stand-ins that let the kernel modules import: their torch references still work and a
kernel call raises a clear error. Without CUDA, Triton can only run in its interpreter; we turn
that on before any kernel is decorated (the choice is made at decoration time), so tests can run
the same kernels on CPU tensors.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    HAS_TRITON = False

    class _Kernel:
        """A decorated kernel without Triton: `kernel[grid](...)` raises a clear error."""

        def __init__(self, fn):
            self.__name__ = fn.__name__

        def __getitem__(self, _grid):
            raise RuntimeError(f"Triton is not installed: cannot launch {self.__name__}")

        def __call__(self, *_a, **_k):
            raise RuntimeError(f"Triton is not installed: cannot run {self.__name__}")

    class _Missing:
        """Stands in for `triton` and `triton.language` so kernel modules import (annotations only)."""

        constexpr = Any

        @staticmethod
        def jit(fn=None, **_kw):
            return _Kernel(fn) if fn is not None else _Kernel

        def __getattr__(self, name: str):
            raise RuntimeError(f"Triton is not installed (needed for triton.{name})")

    triton = _Missing()  # type: ignore[assignment]
    tl = _Missing()  # type: ignore[assignment]


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter (numpy underneath)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def unit_stride(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-sequence index tensors as the kernels read them (element i at base + i): a broadcast view
    (stride 0, e.g. one row of an expanded [depth, request] grid) would hand them its neighbours'
    values. A no-op for the contiguous tensors callers normally pass, so no launch in a graph."""
    return tuple(t.contiguous() for t in ts)


_FORCED: bool | None = None  # set by kernel_dispatch: kernels always (True) or never (False)


def use_triton(t: torch.Tensor) -> bool:
    """Dispatch rule for model code: Triton on CUDA tensors, the torch reference elsewhere.

    The interpreter is for tests, never for serving on the CPU (it is orders of magnitude slower).
    """
    if _FORCED is not None:
        return HAS_TRITON and _FORCED
    return HAS_TRITON and t.is_cuda


@contextlib.contextmanager
def kernel_dispatch(kernels: bool) -> Iterator[None]:
    """Within the block the model code runs its Triton kernels for every tensor (kernels=True: on
    the CPU through the interpreter, for tests) or its torch references only (kernels=False: the
    model as written in torch, for comparisons)."""
    global _FORCED
    saved, _FORCED = _FORCED, kernels
    try:
        yield
    finally:
        _FORCED = saved


_FUSED_DECODE = True  # the decode fusions (packed q/k/v/r, conv + add + norm, router GEMM in-kernel)


def fused_decode() -> bool:
    """Whether model code takes the fused decode kernels (True unless inside `unfused_decode`)."""
    return _FUSED_DECODE


@contextlib.contextmanager
def unfused_decode() -> Iterator[None]:
    """Within the block, decode runs the kernels as they were before the decode fusions (one per
    projection, norm and conv; torch's router GEMM): the "before" of profile and bench scripts."""
    global _FUSED_DECODE
    saved, _FUSED_DECODE = _FUSED_DECODE, False
    try:
        yield
    finally:
        _FUSED_DECODE = saved


_PDL = True  # programmatic dependent launches where the GPU has them (see `pdl_launch`)


@functools.cache
def _device_has_pdl(index: int) -> bool:
    # Hopper and later, and a Triton that exposes grid dependency control.
    try:
        from triton.language.extra import cuda as extra_cuda
    except ImportError:
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9 and hasattr(extra_cuda, "gdc_wait")


def pdl_launch(t: torch.Tensor) -> dict[str, bool]:
    """Launch options of a decode-path kernel whose inputs live on t's device: `PDL` (its constexpr)
    and, where the GPU has them, `launch_pdl`. In a decode step replayed from a CUDA graph each launch
    boundary costs about 1 us (the next kernel is launched only when the last program of this one has
    drained); launched as a programmatic dependent, a kernel's programs are resident before its
    predecessor ends and wait in `pdl_wait`, which returns once that predecessor has finished and its
    writes are visible. Every kernel launched so calls `pdl_wait` before its first memory access, so
    ordering stays transitive: a kernel two launches back has finished before the previous one passed
    its own wait."""
    on = HAS_TRITON and _PDL and t.is_cuda and not interpreting() and _device_has_pdl(t.device.index or 0)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@contextlib.contextmanager
def no_pdl() -> Iterator[None]:
    """Within the block, kernels launch without programmatic dependencies (benchmarks' "before";
    graphs captured inside keep that)."""
    global _PDL
    saved, _PDL = _PDL, False
    try:
        yield
    finally:
        _PDL = saved


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """First statement of a kernel launched with `pdl_launch`: wait until the previous kernel on the
    stream has finished (its writes visible), then let the next one launch (its programs become
    resident and wait in turn). Nothing without PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("this kernel needs Triton, which is not installed")


def dot_mode(dtype: torch.dtype) -> tuple[bool, str]:
    """(upcast dot operands to fp32, input precision) for tl.dot on tensors of `dtype`.

    The interpreter multiplies bfloat16 bit patterns as integers in tl.dot, so under it we upcast
    to fp32. fp32 inputs on the GPU use IEEE products, not TF32, so fp32 runs compare tightly
    against the torch references (bf16 inputs take the tensor-core path with fp32 accumulation).
    """
    if interpreting():
        return True, "ieee"
    return False, "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def mm(a, b, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """tl.dot with fp32 accumulation; operands upcast to fp32 where `dot_mode` says so."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PREC)
    return out


def next_pow2(n: int, floor: int = 1) -> int:
    """Smallest power of two >= max(n, floor) (block shapes must be powers of two)."""
    p = 1
    while p < max(n, floor):
        p *= 2
    return p
