"""Running programs: one (`run`, optionally streaming) or many on a thread pool (`run_batch`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sglang.lang.backend.base_backend import BaseBackend
from sglang.lang.executor import StreamExecutor
from sglang.lang.global_config import global_config
from sglang.lang.ir import SglSamplingParams
from sglang.lang.state import ProgramState


def resolve_backend(backend: Any) -> BaseBackend:
    backend = backend if backend is not None else global_config.default_backend
    if backend is None:
        raise RuntimeError(
            "no backend: pass backend=... or call sgl.set_default_backend(sgl.RuntimeEndpoint(url))"
        )
    # A Runtime is used through the endpoint of the server it started (as upstream does).
    return getattr(backend, "endpoint", backend)


def _run_body(state: ProgramState, func: Callable, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    try:
        state.ret_value = func(state, *args, **kwargs)
    finally:
        state.stream_executor.end()


def run_program(
    func: Callable,
    backend: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    default_sampling: SglSamplingParams,
    stream: bool = False,
    use_thread: bool = True,
) -> ProgramState:
    """Run to completion and raise what failed; with `stream`, return at once and run in the background."""
    executor = StreamExecutor(resolve_backend(backend), kwargs, default_sampling, stream, use_thread)
    state = ProgramState(executor)
    if stream:

        def body() -> None:
            try:
                _run_body(state, func, args, kwargs)
            except BaseException as e:  # the reader of the stream gets it
                executor.fail(e)

        threading.Thread(target=body, daemon=True, name="sgl-program-body").start()
        return state
    _run_body(state, func, args, kwargs)
    executor.sync()
    executor.raise_if_failed()
    return state


def _thread_count(num_threads: int | str, batch_size: int) -> int:
    if num_threads == "auto":
        # Programs mostly wait on the server, so many more threads than cores pay off (upstream's rule).
        num_threads = max(96, (os.cpu_count() or 1) * 16)
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive integer or 'auto', got {num_threads!r}")
    return max(1, min(num_threads, batch_size))


def run_program_batch(
    func: Callable,
    backend: Any,
    batch_arguments: Sequence[dict[str, Any]],
    default_sampling: SglSamplingParams,
    num_threads: int | str = "auto",
    progress_bar: bool = False,
    generator_style: bool = False,
) -> list[ProgramState] | Iterator[ProgramState]:
    """Run one program per argument dict; states come back in the order of the arguments."""
    backend = resolve_backend(backend)
    for i, kw in enumerate(batch_arguments):
        if not isinstance(kw, dict):
            raise TypeError(
                f"run_batch: item {i} must be a dict of the program's arguments, got {type(kw).__name__}"
            )

    def one(kw: dict[str, Any]) -> ProgramState:
        # The pool gives the parallelism; each program runs its expressions inline.
        return run_program(func, backend, (), kw, default_sampling, stream=False, use_thread=False)

    n = len(batch_arguments)
    pool = ThreadPoolExecutor(_thread_count(num_threads, n), thread_name_prefix="sgl-batch")
    futures: list[Future] = [pool.submit(one, kw) for kw in batch_arguments]
    pool.shutdown(wait=False)
    if progress_bar:
        _attach_progress_bar(futures)
    results = (f.result() for f in futures)
    return results if generator_style else list(results)


def _attach_progress_bar(futures: list[Future]) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(total=len(futures))
    lock = threading.Lock()
    remaining = [len(futures)]

    def tick(_: Future) -> None:
        with lock:
            bar.update(1)
            remaining[0] -= 1
            if remaining[0] == 0:
                bar.close()

    for f in futures:
        f.add_done_callback(tick)
