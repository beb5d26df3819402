"""`sampling_params` of a native /generate request: SGLang 0.5.23's 27 parameters, typed and bounded.

`null` means the parameter's default (SGLang's clients send nulls). Every parameter is implemented
except two accepted only at their neutral value: `beam_width` (no beam search here) and `watermark`.
`custom_params` is accepted as SGLang accepts it without a custom logit processor: carried, unused.
Values are range-checked again by SamplingParams.validate (shared with the OpenAI API); the bounds
here are the ones only the native API has (`n`) and the types JSON can get wrong.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

from sgl_inkling.sampling.sampling_params import MAX_N

# As SGLang: more stop strings or patterns than this, or a longer pattern, is refused.
MAX_STOPS = 32
MAX_STOP_REGEX_BYTES = 256

Number = StrictInt | StrictFloat
StrList = StrictStr | list[StrictStr]


def _neutral(name: str, value: Any, neutral: tuple, why: str) -> Any:
    if value not in neutral:
        raise ValueError(f"{name}={value!r} is not supported: {why}")
    return None


class NativeSamplingParams(BaseModel):
    """One request's sampling parameters (SGLang's names and defaults)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_new_tokens: StrictInt | None = Field(None, ge=0, description="default 128; null: up to the context")
    stop: StrList | None = None
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    stop_regex: StrList | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    repetition_penalty: Number | None = None
    min_new_tokens: StrictInt | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] | None = None
    beam_width: StrictInt | None = None
    json_schema: StrictStr | None = None
    regex: StrictStr | None = None
    ebnf: StrictStr | None = None
    structural_tag: StrictStr | None = None
    ignore_eos: StrictBool | None = None
    skip_special_tokens: StrictBool | None = None
    spaces_between_special_tokens: StrictBool | None = None
    no_stop_trim: StrictBool | None = None
    stream_interval: Annotated[StrictInt, Field(ge=1)] | None = None
    logit_bias: dict[str, Number] | None = None
    sampling_seed: StrictInt | None = None
    seed: StrictInt | None = Field(None, description="this server's older spelling of sampling_seed")
    custom_params: dict[str, Any] | None = None
    watermark: Any = None

    @field_validator("stop", "stop_regex")
    @classmethod
    def _few_stops(cls, v):
        if isinstance(v, list) and len(v) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} are allowed, got {len(v)}")
        return v

    @field_validator("stop_regex")
    @classmethod
    def _short_patterns(cls, v):
        for p in [v] if isinstance(v, str) else v or []:
            if len(p.encode()) > MAX_STOP_REGEX_BYTES:
                raise ValueError(f"a pattern may have at most {MAX_STOP_REGEX_BYTES} bytes")
        return v

    @field_validator("beam_width")
    @classmethod
    def _no_beams(cls, v):
        return _neutral("beam_width", v, (None, 1), "beam search is not implemented by this server")

    @field_validator("watermark")
    @classmethod
    def _no_watermark(cls, v):
        return _neutral("watermark", v, (None,), "output watermarking is not implemented by this server")

    def to_dict(self) -> dict[str, Any]:
        """The set parameters, as SamplingParams.from_dict takes them (nulls dropped: the defaults)."""
        d = self.model_dump(exclude_none=True, exclude={"beam_width", "watermark"})
        # Empty grammars mean "unset" in SGLang, not "constrain to nothing".
        for name in ("json_schema", "regex", "ebnf", "structural_tag"):
            if d.get(name) == "":
                del d[name]
        return d
