"""`@sgl.function`: a Python function `f(s, ...)` becomes a program with run / run_batch."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sglang.lang.interpreter import run_program, run_program_batch
from sglang.lang.ir import SglSamplingParams
from sglang.lang.state import ProgramState


def _default_sampling(
    max_new_tokens: int | None,
    stop: str | list[str] | None,
    stop_token_ids: list[int] | None,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    frequency_penalty: float,
    presence_penalty: float,
    ignore_eos: bool,
    return_logprob: bool | None,
    logprob_start_len: int | None,
    top_logprobs_num: int | None,
    return_text_in_logprobs: bool | None,
) -> SglSamplingParams:
    return SglSamplingParams(
        max_new_tokens=max_new_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        ignore_eos=ignore_eos,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
    )


class SglFunction:
    def __init__(
        self,
        func: Callable,
        num_api_spec_tokens: int | None = None,
        bind_arguments: dict[str, Any] | None = None,
    ):
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(
                f"an SGLang function takes the program state as its first argument: {func.__name__}"
            )
        self.func = func
        # Upstream uses this for speculative execution against API models; the SGLang server path
        # (the only backend here) never needs it, so it is accepted and kept for introspection.
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self.arg_names = params[1:]
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> SglFunction:
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.func.__name__}() has no argument(s) {sorted(unknown)}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def run(
        self,
        *args: Any,
        max_new_tokens: int | None = 128,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        stream: bool = False,
        backend: Any = None,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run once. The sampling arguments are defaults that each gen() may override."""
        sampling = _default_sampling(
            max_new_tokens, stop, stop_token_ids, temperature, top_p, top_k, min_p, frequency_penalty,
            presence_penalty, ignore_eos, return_logprob, logprob_start_len, top_logprobs_num,
            return_text_in_logprobs,
        )  # fmt: skip
        kwargs = {**self.bind_arguments, **kwargs}
        return run_program(self.func, backend, args, kwargs, sampling, stream, use_thread)

    def run_batch(
        self,
        batch_kwargs: Sequence[dict[str, Any]],
        *,
        max_new_tokens: int | None = 128,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per dict of arguments, `num_threads` at a time; results keep the input order."""
        sampling = _default_sampling(
            max_new_tokens, stop, stop_token_ids, temperature, top_p, top_k, min_p, frequency_penalty,
            presence_penalty, ignore_eos, return_logprob, logprob_start_len, top_logprobs_num,
            return_text_in_logprobs,
        )  # fmt: skip
        batch = [{**self.bind_arguments, **kw} if isinstance(kw, dict) else kw for kw in batch_kwargs]
        return run_program_batch(
            self.func, backend, batch, sampling, num_threads, progress_bar, generator_style
        )

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    def __repr__(self) -> str:
        return f"SglFunction({self.func.__name__})"


def function(func: Callable | None = None, num_api_spec_tokens: int | None = None):
    """Decorator, bare (`@sgl.function`) or with options (`@sgl.function(num_api_spec_tokens=64)`)."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)
