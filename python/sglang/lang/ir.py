"""The frontend language's expressions: what `s += ...` submits to a program's executor.

Expressions are inert descriptions; `executor.StreamExecutor` interprets them. `+` concatenates them
(and plain strings) into an `SglExprList`, as upstream SGLang's `"Q: " + sgl.gen("a")` does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Regexes for `gen(dtype=...)` / `gen_int` / `gen_string`: the server's grammar layer enforces them.
REGEX_INT = r"[-+]?[0-9]+"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""
_DTYPE_REGEX = {int: REGEX_INT, float: REGEX_FLOAT, bool: REGEX_BOOL, str: REGEX_STR}


@dataclass
class SglSamplingParams:
    """Sampling settings of one gen. `None` means "not set here": `merged_over` fills it from defaults."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    regex: str | None = None
    json_schema: str | dict | None = None
    # Request-level options (SGLang keeps them outside sampling_params on the wire).
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None

    _REQUEST_LEVEL = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")

    def merged_over(self, defaults: SglSamplingParams) -> SglSamplingParams:
        """Fields set here win; the rest come from `defaults` (the program's run() arguments)."""
        out = dataclasses.replace(defaults)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                setattr(out, f.name, value)
        return out

    def sampling_dict(self) -> dict[str, Any]:
        """The native `sampling_params` object (SGLang field names); unset fields are left out."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or f.name in self._REQUEST_LEVEL:
                continue
            if f.name == "json_schema" and not isinstance(value, str):
                value = json.dumps(value)  # the server takes the schema as JSON text
            if f.name == "stop" and isinstance(value, (list, tuple)) and not value:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def request_dict(self) -> dict[str, Any]:
        """The request-level logprob options that are set."""
        return {k: getattr(self, k) for k in self._REQUEST_LEVEL if getattr(self, k) is not None}

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class SglExpr:
    """Base of all expressions; supports `+` with other expressions and strings."""

    def __add__(self, other: SglExpr | str) -> SglExprList:
        return SglExprList([self, to_expr(other)])

    def __radd__(self, other: SglExpr | str) -> SglExprList:
        return SglExprList([to_expr(other), self])


class SglExprList(SglExpr):
    def __init__(self, exprs: Sequence[SglExpr]):
        # Flatten nested lists so the executor sees one level.
        self.exprs: list[SglExpr] = []
        for e in exprs:
            self.exprs.extend(e.exprs if isinstance(e, SglExprList) else [e])

    def __repr__(self) -> str:
        return f"SglExprList({self.exprs!r})"


class SglConstantText(SglExpr):
    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return f"SglConstantText({self.value!r})"


class SglGen(SglExpr):
    def __init__(self, name: str | None, sampling: SglSamplingParams, dtype: type | None = None):
        if dtype is not None:
            if dtype not in _DTYPE_REGEX:
                raise ValueError(f"gen(dtype=...) must be one of int, float, bool, str; got {dtype!r}")
            if sampling.regex is not None or sampling.json_schema is not None:
                raise ValueError("gen(): give at most one of dtype, regex and json_schema")
            sampling.regex = _DTYPE_REGEX[dtype]
        if sampling.regex is not None and sampling.json_schema is not None:
            raise ValueError("gen(): give at most one of regex and json_schema")
        self.name = name
        self.sampling = sampling

    def __repr__(self) -> str:
        return f"SglGen({self.name!r})"


class SglSelect(SglExpr):
    def __init__(
        self, name: str | None, choices: Sequence[str], temperature: float, choices_method: Callable
    ):
        if isinstance(choices, str) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"select choices must be a non-empty list of non-empty strings, got {choices!r}")
        self.name = name
        self.choices = list(choices)
        self.temperature = temperature
        self.choices_method = choices_method

    def __repr__(self) -> str:
        return f"SglSelect({self.name!r}, {self.choices!r})"


class SglRoleBegin(SglExpr):
    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"SglRoleBegin({self.role!r})"


class SglRoleEnd(SglExpr):
    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"SglRoleEnd({self.role!r})"


class SglMedia(SglExpr):
    """An image or audio clip (`sgl.image` / `sgl.audio`), already turned into a data URL."""

    def __init__(self, kind: str, url: str):
        self.kind = kind
        self.url = url

    def __repr__(self) -> str:
        return f"SglMedia({self.kind!r}, {self.url[:40]!r}...)"


def to_expr(value: SglExpr | str) -> SglExpr:
    if isinstance(value, SglExpr):
        return value
    if isinstance(value, str):
        return SglConstantText(value)
    raise TypeError(
        f"cannot add {type(value).__name__} to an SGLang program; use a string or sgl.gen/select/..."
    )
