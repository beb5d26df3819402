"""Which Triton kernels compile, and when: a hook on Triton's in-process JIT cache misses.

`compile_watch()` records every kernel compiled while it is open (the GPU test that serving never
compiles after warm-up uses it); `log_compiles_after_warmup()` keeps a permanent hook that warns
for each compile from then on, so a shape warm-up missed shows in the server log by name.
The interpreter (CPU) compiles nothing, so neither ever fires there: on the CPU, `jit_keys` computes
each launch's compile key from its arguments instead (test/kernels/test_no_new_kernel_keys.py runs
the same check as the GPU test through it).
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Callable, Iterator

from sgl_inkling_kernels._triton import HAS_TRITON, interpreting

logger = logging.getLogger(__name__)

_listeners: list[Callable[[str], None]] = []
_installed = False
_warming = 0  # > 0 while a warm-up runs: its compiles are the point, not news


def _hook(*, repr: str, compile: dict | None = None, **_kw) -> None:  # noqa: A002 - Triton's keywords
    # Triton 3.6 builds `repr`'s argument list from a key layout it no longer has ("(Act: ()"), so the
    # variant's signature, constants and divisibility come from its specialization data when present.
    data = (compile or {}).get("specialization_data")
    desc = f"{repr} {data}" if data else repr
    for fn in list(_listeners):
        fn(desc)


def _install() -> None:
    global _installed
    if _installed or not HAS_TRITON or interpreting():
        return
    from triton import knobs

    previous = knobs.runtime.jit_post_compile_hook

    def chained(**kw):
        _hook(**kw)
        if previous is not None:
            return previous(**kw)
        return None

    knobs.runtime.jit_post_compile_hook = chained
    _installed = True


@contextlib.contextmanager
def compile_watch() -> Iterator[list[str]]:
    """Within the block, the list fills with a description of each kernel Triton compiles."""
    _install()
    seen: list[str] = []
    _listeners.append(seen.append)
    try:
        yield seen
    finally:
        _listeners.remove(seen.append)


@contextlib.contextmanager
def warming_up() -> Iterator[None]:
    """Within the block compiles are not warned about (a second ModelRunner's warm-up in the same
    process, as the benchmarks make one per batch size, compiles by design)."""
    global _warming
    _warming += 1
    try:
        yield
    finally:
        _warming -= 1


def log_compiles_after_warmup() -> None:
    """From now on, warn for every kernel compile (once per process)."""
    if _warn not in _listeners:
        _install()
        _listeners.append(_warn)


def _warn(desc: str) -> None:
    if _warming:
        return
    # The whole description: the argument specialisations at its end say which variant warm-up missed;
    # the launching line says which path the warm-up did not take.
    logger.warning("Triton compiled a kernel after warm-up (a request waits for it), launched from %s: %s",
                   _launch_site(), " ".join(desc.split()))  # fmt: skip


def _launch_site() -> str:
    """The innermost frame outside Triton and this module: the call that launched the kernel, and
    the one above it."""
    frames = [f for f in traceback.extract_stack() if "/triton/" not in f.filename and not f.filename.endswith("jit_watch.py")]
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} ({f.name})" for f in reversed(frames[-2:]))
