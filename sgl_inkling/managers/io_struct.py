"""Typed messages between the HTTP process, the scheduler and the detokenizer (pickled over ZMQ)."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import Any


class RequestError(Exception):
    """A request the server refuses: becomes an HTTP 4xx with this message; the server keeps serving."""

    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.message = message
        self.status_code = status_code


@dataclass
class GenerateReqInput:
    """SGLang's native /generate body; a single request or a batch (lists)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict | list[dict] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] = -1
    top_logprobs_num: int | list[int] = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    image_data: Any = None
    audio_data: Any = None
    # Set by the chat layer (TMLv0 framing, tools); native requests get theirs from sampling_params.
    grammar: Any = None  # sgl_inkling.constrained.GrammarSpec
    # Set by the chat layer: media already laid into input_ids (sgl_inkling.multimodal.MediaItem).
    mm_items: Any = None
    data_parallel_rank: int | None = None  # pin to one --dp-size replica (sglang-router --dp-aware)

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    def batch_size(self) -> int:
        if not self.is_batch:
            return 1
        return len(self.text) if self.text is not None else len(self.input_ids)

    def item(self, i: int) -> GenerateReqInput:
        """The i-th request of a batch as a single request."""

        def pick(x, default=None):
            return x[i] if isinstance(x, list) else (default if x is None else x)

        if not self.is_batch:  # n > 1 of one prompt: the prompt itself, never its i-th character/id
            return dataclasses.replace(self, sampling_params=self.sampling_params or {})
        return GenerateReqInput(
            text=self.text[i] if self.text is not None else None,
            input_ids=self.input_ids[i] if self.input_ids is not None else None,
            sampling_params=pick(self.sampling_params, {}),
            rid=self.rid[i] if isinstance(self.rid, list) else None,
            return_logprob=pick(self.return_logprob),
            logprob_start_len=pick(self.logprob_start_len),
            top_logprobs_num=pick(self.top_logprobs_num),
            return_text_in_logprobs=self.return_text_in_logprobs,
            stream=self.stream,
            image_data=pick(self.image_data) if self.is_batch else self.image_data,
            audio_data=pick(self.audio_data) if self.is_batch else self.audio_data,
            grammar=self.grammar,
            mm_items=self.mm_items,
            data_parallel_rank=self.data_parallel_rank,
        )


# finish_reason["fault"] of requests lost because the model step failed: the server is unhealthy.
MODEL_STEP_FAULT = "model_step"


def new_rid() -> str:
    return uuid.uuid4().hex


@dataclass
class TokenizedGenerateReq:
    """A validated request on its way to the scheduler."""

    rid: str
    input_ids: list[int]
    sampling_params: Any  # sgl_inkling.sampling.sampling_params.SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    stop_token_ids: list[int] = field(default_factory=list)  # end-of-turn and eos ids unless ignore_eos
    grammar: Any = None  # sgl_inkling.constrained.GrammarSpec: compiled and enforced by the scheduler
    mm_items: list | None = None  # sgl_inkling.multimodal.MediaItem: images and audio, by prompt position
    data_parallel_rank: int | None = None  # the data-parallel controller's choice unless set


@dataclass
class AbortReq:
    rid: str
    abort_all: bool = False  # only an explicit abort_all stops every request (an empty rid is no rid)


@dataclass
class FlushCacheReq:
    pass


@dataclass
class GetInternalStateReq:
    pass


@dataclass
class InternalState:
    """Scheduler state for /get_server_info and the leak checks in tests."""

    state: dict[str, Any]


@dataclass
class FlushCacheResp:
    success: bool
    message: str = ""


@dataclass
class BatchTokenOut:
    """Scheduler -> detokenizer: new tokens of the requests that advanced this step."""

    rids: list[str]
    new_token_ids: list[list[int]]
    finished_reasons: list[dict | None]  # {"type": "stop"|"length"|"abort", "matched": ..., "message": ...}
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    skip_special_tokens: list[bool]
    # Per request, the logprob entries added this step: (logprob, token_id) and top-k lists.
    output_token_logprobs: list[list[tuple[float, int]] | None]
    output_top_logprobs: list[list[list[tuple[float, int]]] | None]
    input_token_logprobs: list[list[tuple[float | None, int]] | None]
    stop_strs: list[str | None]  # the matched stop string, for the detokenizer to trim
    # MTP: verify steps so far and drafts accepted in them, per request (None without MTP).
    spec_verify_ct: list[int] | None = None
    spec_accepted_drafts: list[int] | None = None
    queue_times: list[float | None] | None = None  # seconds from arrival to first admission


@dataclass
class BatchStrOut:
    """Detokenizer -> tokenizer manager: the same, plus the new text of each request."""

    tokens: BatchTokenOut
    new_texts: list[str]
