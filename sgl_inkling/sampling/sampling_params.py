"""Per-request sampling parameters, with SGLang's native field names and defaults.

Request-level logprob options (return_logprob, top_logprobs_num, logprob_start_len) are not
sampling parameters and live on the request, as in SGLang.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Below this temperature a request is decoded greedily (SGLang uses the same threshold).
GREEDY_TEMPERATURE_EPS = 1e-6
# OpenAI documents logit_bias values in [-100, 100].
LOGIT_BIAS_LIMIT = 100.0
# Parallel samples of one native prompt: each is a full request in the scheduler, so this bounds the
# work one body can ask for (n = 2**70 once froze the HTTP process).
MAX_N = 128
# Top logprobs per position on the native API (10**6 once made a 26 MB answer for 4 tokens).
MAX_TOP_LOGPROBS = 20


class SamplingParamsError(ValueError):
    """A sampling parameter is invalid; the message names the offending field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass
class SamplingParams:
    # None means "bounded only by the context length"; the scheduler resolves it (as SGLang).
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    # Python regular expressions searched in the output's tail; the match stays in the text (SGLang).
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    # Token id -> additive bias on the logits (keys may be strings, as JSON delivers them).
    logit_bias: dict[int, float] | None = None
    # Carried for the grammar layer; at most one may be set.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None  # xgrammar structural tag (JSON text)
    # Stream a chunk every this many tokens (None: the server's --stream-interval).
    stream_interval: int | None = None
    # For custom logit processors in SGLang; this server has none, so they are carried unused.
    custom_params: dict | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SamplingParams:
        """Build from a native `sampling_params` dict; unknown keys are an error."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise SamplingParamsError("sampling_params", f"expected an object, got {type(d).__name__}")
        d = dict(d)
        # Newer SGLang spells the seed `sampling_seed`; accept either, not both.
        if "sampling_seed" in d:
            if "seed" in d and d["seed"] is not None and d["sampling_seed"] is not None:
                raise SamplingParamsError("sampling_seed", "give either seed or sampling_seed, not both")
            alias = d.pop("sampling_seed")
            if d.get("seed") is None:
                d["seed"] = alias
        known = cls.field_names()
        unknown = sorted(k for k in d if k not in known)
        if unknown:
            names = ", ".join(repr(k) for k in unknown)
            raise SamplingParamsError(
                unknown[0],
                f"unknown sampling parameter(s) {names}; valid ones are {', '.join(sorted(known))}",
            )
        return cls(**d)

    @classmethod
    def from_openai(cls, req: Mapping[str, Any], *, default_max_tokens: int | None = None) -> SamplingParams:
        """Map an OpenAI (chat) completion request body to SamplingParams.

        Fields that are not sampling parameters (messages, model, stream, logprobs, ...) are
        ignored. SGLang's extra sampling fields (top_k, min_p, regex, ...) are honoured too.
        """
        g = req.get
        kw: dict[str, Any] = {}

        # Chat's max_completion_tokens supersedes the deprecated max_tokens.
        max_tokens = g("max_completion_tokens")
        if max_tokens is None:
            max_tokens = g("max_tokens")
        kw["max_new_tokens"] = default_max_tokens if max_tokens is None else max_tokens

        if g("min_tokens") is not None:
            kw["min_new_tokens"] = g("min_tokens")
        for name in ("temperature", "top_p", "frequency_penalty", "presence_penalty", "n", "seed"):
            if g(name) is not None:
                kw[name] = g(name)
        for name in (
            "top_k",
            "min_p",
            "repetition_penalty",
            "min_new_tokens",
            "stop_token_ids",
            "ignore_eos",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "no_stop_trim",
            "regex",
            "ebnf",
            "json_schema",
        ):
            if g(name) is not None:
                kw[name] = g(name)
        stop = g("stop")
        if stop is not None:
            # OpenAI allows "" / [] to mean no stop sequence.
            if isinstance(stop, str):
                kw["stop"] = [stop] if stop else None
            else:
                kw["stop"] = list(stop) or None
        if g("logit_bias"):
            kw["logit_bias"] = dict(g("logit_bias"))

        rf = g("response_format")
        if rf is not None:
            rtype = rf.get("type") if isinstance(rf, Mapping) else None
            if rtype == "json_schema":
                spec = rf.get("json_schema") or {}
                schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, Mapping) else None
                if schema is None:
                    raise SamplingParamsError("response_format", "json_schema.schema is required")
                kw["json_schema"] = schema if isinstance(schema, str) else json.dumps(schema)
            elif rtype == "json_object":
                kw["json_schema"] = '{"type": "object"}'
            elif rtype not in (None, "text"):
                raise SamplingParamsError("response_format", f"unsupported type {rtype!r}")
        return cls(**kw)

    # ------------------------------------------------------------------ derived views

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS or self.top_k == 1

    @property
    def stop_strs(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def stop_regexes(self) -> list[str]:
        if self.stop_regex is None:
            return []
        return [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex)

    @property
    def logit_bias_ids(self) -> dict[int, float]:
        """logit_bias with integer keys (validate() guarantees they parse)."""
        return {int(k): float(v) for k, v in (self.logit_bias or {}).items()}

    @property
    def needs_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.min_new_tokens > 0
            or bool(self.logit_bias)
        )

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in sorted(self.field_names())}

    # ------------------------------------------------------------------ validation

    def validate(self, context_length: int | None = None, vocab_size: int | None = None) -> SamplingParams:
        """Raise SamplingParamsError naming the first bad field; returns self for chaining."""
        temperature = _number(self.temperature, "temperature")
        if not math.isfinite(temperature) or temperature < 0:
            raise SamplingParamsError("temperature", f"must be a finite number >= 0, got {self.temperature}")
        top_p = _number(self.top_p, "top_p")
        if not 0.0 < top_p <= 1.0:
            raise SamplingParamsError("top_p", f"must be in (0, 1], got {self.top_p}")
        top_k = _integer(self.top_k, "top_k")
        if top_k < 1 and top_k != -1:
            raise SamplingParamsError("top_k", f"must be -1 (off) or >= 1, got {self.top_k}")
        min_p = _number(self.min_p, "min_p")
        if not 0.0 <= min_p <= 1.0:
            raise SamplingParamsError("min_p", f"must be in [0, 1], got {self.min_p}")
        rep = _number(self.repetition_penalty, "repetition_penalty")
        if not (math.isfinite(rep) and rep > 0):
            raise SamplingParamsError("repetition_penalty", f"must be a finite number > 0, got {rep}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = _number(getattr(self, name), name)
            if not -2.0 <= value <= 2.0:
                raise SamplingParamsError(name, f"must be in [-2, 2], got {value}")

        if self.max_new_tokens is not None:
            max_new = _integer(self.max_new_tokens, "max_new_tokens")
            if max_new < 0:
                raise SamplingParamsError("max_new_tokens", f"must be >= 0, got {max_new}")
            if context_length is not None and max_new > context_length:
                raise SamplingParamsError(
                    "max_new_tokens", f"{max_new} exceeds the model's context length {context_length}"
                )
        min_new = _integer(self.min_new_tokens, "min_new_tokens")
        if min_new < 0:
            raise SamplingParamsError("min_new_tokens", f"must be >= 0, got {min_new}")
        if self.max_new_tokens is not None and min_new > self.max_new_tokens:
            raise SamplingParamsError(
                "min_new_tokens", f"{min_new} is larger than max_new_tokens {self.max_new_tokens}"
            )
        n = _integer(self.n, "n")
        if n < 1:
            raise SamplingParamsError("n", f"must be >= 1, got {n}")
        if self.seed is not None:
            _integer(self.seed, "seed")

        if self.stop is not None and not isinstance(self.stop, str):
            if not isinstance(self.stop, list | tuple):
                raise SamplingParamsError("stop", "must be a string or a list of strings")
            for s in self.stop:
                if not isinstance(s, str):
                    raise SamplingParamsError("stop", f"every stop sequence must be a string, got {s!r}")
        if self.stop_regex is not None and not isinstance(self.stop_regex, str | list | tuple):
            raise SamplingParamsError("stop_regex", "must be a pattern or a list of patterns")
        for pattern in self.stop_regexes:
            if not isinstance(pattern, str) or not pattern:
                raise SamplingParamsError("stop_regex", "must be a non-empty pattern or a list of them")
            try:
                re.compile(pattern)
            except (re.error, RecursionError, OverflowError) as e:
                raise SamplingParamsError("stop_regex", f"invalid pattern {pattern!r}: {e}") from None
        if self.stream_interval is not None and _integer(self.stream_interval, "stream_interval") < 1:
            raise SamplingParamsError("stream_interval", f"must be >= 1, got {self.stream_interval}")
        if self.custom_params is not None and not isinstance(self.custom_params, Mapping):
            raise SamplingParamsError("custom_params", "must be an object")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list | tuple | set):
                raise SamplingParamsError("stop_token_ids", "must be a list of token ids")
            for t in self.stop_token_ids:
                if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                    raise SamplingParamsError("stop_token_ids", f"token ids must be ints >= 0, got {t!r}")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamsError(name, f"must be a boolean, got {getattr(self, name)!r}")

        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise SamplingParamsError("logit_bias", "must map token ids to numbers")
            for k, v in self.logit_bias.items():
                try:
                    tok = int(k)
                except (TypeError, ValueError):
                    raise SamplingParamsError("logit_bias", f"key {k!r} is not a token id") from None
                if tok < 0 or (isinstance(k, float) and k != tok):
                    raise SamplingParamsError("logit_bias", f"key {k!r} is not a token id")
                if vocab_size is not None and tok >= vocab_size:
                    raise SamplingParamsError(
                        "logit_bias", f"token id {tok} is outside the vocabulary [0, {vocab_size})"
                    )
                bias = _number(v, "logit_bias")
                if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                    raise SamplingParamsError(
                        "logit_bias", f"bias for token {k} must be in [-100, 100], got {v}"
                    )

        grammars = [
            name for name in ("json_schema", "regex", "ebnf", "structural_tag") if getattr(self, name) is not None
        ]
        for name in grammars:
            if not isinstance(getattr(self, name), str):
                raise SamplingParamsError(name, "must be a string")
        if len(grammars) > 1:
            raise SamplingParamsError(
                grammars[1], f"only one of json_schema, regex, ebnf, structural_tag may be set ({grammars})"
            )
        return self


def _number(value: Any, name: str) -> float:
    # bool is an int subclass; a JSON `true` for temperature is a client bug, not 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SamplingParamsError(name, f"must be a number, got {value!r}")
    if math.isnan(value):
        raise SamplingParamsError(name, "must not be NaN")
    return float(value)


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingParamsError(name, f"must be an integer, got {value!r}")
    return value
