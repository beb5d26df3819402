"""The public frontend API: `sgl.gen`, `sgl.select`, roles, `sgl.image` and the default backend."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from sglang.lang.choices import ChoicesSamplingMethod, token_length_normalized
from sglang.lang.exports import API_NAMES
from sglang.lang.function import SglFunction, function  # noqa: F401  (re-exported via API_NAMES)
from sglang.lang.global_config import global_config
from sglang.lang.interpreter import resolve_backend
from sglang.lang.ir import (
    SglExpr,
    SglExprList,
    SglGen,
    SglMedia,
    SglRoleBegin,
    SglRoleEnd,
    SglSamplingParams,
    SglSelect,
    to_expr,
)
from sglang.lang.media import to_data_url


def set_default_backend(backend: Any) -> None:
    """The backend programs run on unless `run(backend=...)` says otherwise (RuntimeEndpoint or Runtime)."""
    global_config.default_backend = backend


def flush_cache(backend: Any = None) -> None:
    resolve_backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    return resolve_backend(backend).get_server_info()


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | None = None,
    choices: list[str] | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
    regex: str | None = None,
    json_schema: str | dict | None = None,
) -> SglExpr:
    """Generate text into variable `name`; unset options take the values given to run().

    With `choices`, this is `select`. In a chat program, use it inside a role: the value of an
    assistant gen is the visible text of the model's turn (thinking is kept in its meta info).
    """
    if choices is not None:
        return select(name, choices, 0.0 if temperature is None else temperature, choices_method)
    sampling = SglSamplingParams(
        max_new_tokens=max_tokens,
        min_new_tokens=min_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        ignore_eos=ignore_eos,
        regex=regex,
        json_schema=json_schema,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
    )
    return SglGen(name, sampling, dtype)


def gen_int(name: str | None = None, **kwargs: Any) -> SglExpr:
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> SglExpr:
    return gen(name, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: Callable | None = None,
) -> SglExpr:
    """Append the choice the model finds most likely (default: highest mean token log-probability)."""
    if choices is None:
        raise ValueError("select() needs choices")
    return SglSelect(name, choices, temperature, choices_method or token_length_normalized)


def _role(role: str, expr: SglExpr | str | None) -> SglExpr:
    if expr is None:
        return SglExprList([SglRoleBegin(role), SglRoleEnd(role)])
    return SglExprList([SglRoleBegin(role), to_expr(expr), SglRoleEnd(role)])


def system(expr: SglExpr | str | None = None) -> SglExpr:
    return _role("system", expr)


def user(expr: SglExpr | str | None = None) -> SglExpr:
    return _role("user", expr)


def assistant(expr: SglExpr | str | None = None) -> SglExpr:
    return _role("assistant", expr)


def system_begin() -> SglExpr:
    return SglRoleBegin("system")


def system_end() -> SglExpr:
    return SglRoleEnd("system")


def user_begin() -> SglExpr:
    return SglRoleBegin("user")


def user_end() -> SglExpr:
    return SglRoleEnd("user")


def assistant_begin() -> SglExpr:
    return SglRoleBegin("assistant")


def assistant_end() -> SglExpr:
    return SglRoleEnd("assistant")


class MultimodalNotAvailableError(NotImplementedError):
    """Raised by sgl.video: the server takes images and audio, not video."""


def image(source: str | bytes | os.PathLike) -> SglExpr:
    """An image (file path, data URL or bytes): inside a role it is an image part of that message;
    in a raw program, one image placeholder in the text. Needs a server with --enable-multimodal."""
    return SglMedia("image", to_data_url(source, "image"))


def audio(source: str | bytes | os.PathLike) -> SglExpr:
    """An audio clip (WAV/FLAC/MP3 file path, data URL or bytes), placed like `image`."""
    return SglMedia("audio", to_data_url(source, "audio"))


def video(path: str, num_frames: int) -> SglExpr:
    raise MultimodalNotAvailableError("sgl.video: video input is not available in sglang-inkling")


__all__ = ["SglFunction", *API_NAMES]
