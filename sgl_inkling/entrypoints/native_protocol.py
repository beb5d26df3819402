"""The native /generate body: every field of SGLang 0.5.23's GenerateReqInput, typed and bounded.

`null` means the default for every field, as SGLang's clients send it. A field is either
- implemented (text, input_ids, sampling_params, rid, logprob options, stream, media, DP rank),
- request metadata with no effect on the output here (logging, tracing, routing labels): any value,
- or a capability this server lacks: accepted only at its neutral value, any other value a 400 that
  names the field and the reason (`UNSUPPORTED`).
Fields SGLang sets internally and this server's own internal fields (`mm_items`, `grammar`) are not
part of the body: sending them is a 400. Batch lists must match the batch and rids must be unique.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    model_validator,
)

from sgl_inkling.entrypoints.native_sampling import NativeSamplingParams
from sgl_inkling.managers.io_struct import GenerateReqInput
from sgl_inkling.sampling.sampling_params import MAX_TOP_LOGPROBS


def _one_or_many(v: Any) -> str:
    return "many" if isinstance(v, list) else "one"


def _ids_shape(v: Any) -> str:
    return "many" if isinstance(v, list) and v and isinstance(v[0], list) else "one"


def one_or_many(t: Any) -> Any:
    """`t` or a list of `t` (one per request of a batch), with errors that name the field plainly."""
    return Annotated[Annotated[t, Tag("one")] | Annotated[list[t], Tag("many")], Discriminator(_one_or_many)]


TokenIds = list[Annotated[StrictInt, Field(ge=0)]]
InputIds = Annotated[
    Annotated[TokenIds, Tag("one")] | Annotated[list[TokenIds], Tag("many")], Discriminator(_ids_shape)
]
TopLogprobs = Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)]
StartLen = Annotated[StrictInt, Field(ge=-1)]
DpRank = Annotated[StrictInt, Field(ge=0)]

# Field -> (neutral values, why another value is refused).
UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "input_embeds": ((None,), "prompts as embeddings are not supported; send text or input_ids"),
    "video_data": ((None,), "Inkling has no video input"),
    "use_audio_in_video": ((None, False), "Inkling has no video input"),
    "video_config": ((None,), "Inkling has no video input"),
    "video_max_dynamic_patch": ((None,), "Inkling has no video input"),
    "mm_hashes": ((None,), "caller-computed media hashes are not supported"),
    "mm_content_hashes": ((None,), "caller-computed media hashes are not supported"),
    "modalities": ((None,), "media kinds are inferred from image_data/audio_data"),
    "max_dynamic_patch": ((None,), "Inkling's image patching has no tiling controls"),
    "min_dynamic_patch": ((None,), "Inkling's image patching has no tiling controls"),
    "image_max_dynamic_patch": ((None,), "Inkling's image patching has no tiling controls"),
    "images_config": ((None,), "Inkling's image patching has no tiling controls"),
    "mm_processor_kwargs": ((None,), "the media processors take no per-request options"),
    "watermark": ((None,), "output watermarking is not implemented"),
    "token_ids_logprob": ((None,), "logprobs of chosen token ids are not implemented; use top_logprobs_num"),
    "return_sampling_mask": ((None, False), "sampling masks are not returned by this server"),
    "sampling_logprobs_mode": ((None,), "sampling masks are not returned by this server"),
    "return_flat_raw_top_logprobs": ((None, False), "flat logprob arrays are not implemented"),
    "return_flat_raw_output_top_logprobs": ((None, False), "flat logprob arrays are not implemented"),
    "return_flat_raw_top_logprobs_b64": ((None, False), "flat logprob arrays are not implemented"),
    "return_hidden_states": ((None, False), "hidden states are not returned by this server"),
    "return_routed_experts": ((None, False), "routed-expert capture is not implemented by this server"),
    "routed_experts_start_len": ((None, 0), "routed-expert capture is not implemented by this server"),
    "return_indexer_topk": ((None, False), "Inkling has no sparse-attention indexer"),
    "session_params": ((None,), "sessions (continual prompting) are not implemented"),
    "lora_path": ((None,), "LoRA adapters are not supported"),
    "lora_id": ((None,), "LoRA adapters are not supported"),
    "custom_logit_processor": ((None,), "custom logit processors are not supported"),
    "positional_embed_overrides": ((None,), "embedding overrides are not supported"),
    "bootstrap_host": ((None,), "prefill/decode disaggregation is not supported"),
    "bootstrap_port": ((None,), "prefill/decode disaggregation is not supported"),
    "bootstrap_room": ((None,), "prefill/decode disaggregation is not supported"),
    "bootstrap_pair_key": ((None,), "prefill/decode disaggregation is not supported"),
    "decode_tp_size": ((None,), "prefill/decode disaggregation is not supported"),
    "disagg_prefill_dp_rank": ((None,), "prefill/decode disaggregation is not supported"),
    "need_wait_for_mm_inputs": ((None, False), "encoder disaggregation is not supported"),
    "num_items_assigned": ((None,), "encoder disaggregation is not supported"),
    "encoder_urls": ((None,), "encoder disaggregation is not supported"),
    "http_worker_ipc": ((None,), "set by SGLang's multi-tokenizer mode, never by clients"),
    "background": ((None, False), "background requests belong to the Responses API"),
    "require_reasoning": ((None, False), "reasoning is controlled by the chat API's reasoning effort"),
    "max_thinking_tokens": ((None,), "thinking budgets are not enforced by this server"),
    "priority": ((None,), "priority scheduling is not implemented"),
    "extra_key": ((None,), "cache namespaces are not implemented"),
    "cache_salt": ((None,), "cache namespaces are not implemented"),
    "return_bytes": ((None, False), "this is a text model"),
    "return_entropy": ((None, False), "entropies are not returned by this server"),
    "return_prompt_token_ids": ((None, False), "prompt token ids are not returned; see input_token_logprobs"),
    "multi_item_delimiter_indices": ((None,), "multi-item scoring is not implemented"),
    "token_indices_to_pool": ((None,), "pooling readouts are not implemented"),
    "kv_hints": ((None,), "hierarchical-cache hints are not implemented"),
}
# Request metadata: logging, tracing and routing labels; no effect on what is generated here.
METADATA = (
    "model", "session_id", "log_metrics", "no_logs", "custom_labels", "routing_key", "conversation_id",
    "external_trace_header", "received_time",
)  # fmt: skip


class GenerateRequest(BaseModel):
    """A single request or a batch (lists: one entry per request)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    text: one_or_many(StrictStr) | None = None
    input_ids: InputIds | None = None
    sampling_params: one_or_many(NativeSamplingParams) | None = None
    rid: one_or_many(StrictStr) | None = None
    return_logprob: one_or_many(StrictBool | None) | None = None  # a batch's nulls: the default too
    logprob_start_len: one_or_many(StartLen | None) | None = None
    top_logprobs_num: one_or_many(TopLogprobs | None) | None = None
    return_text_in_logprobs: StrictBool | None = None
    stream: StrictBool | None = None
    image_data: Any = None
    audio_data: Any = None
    data_parallel_rank: DpRank | None = None
    routed_dp_rank: DpRank | None = Field(None, description="SGLang's newer name of data_parallel_rank")
    # Metadata (see METADATA).
    model: StrictStr | None = None
    session_id: StrictStr | None = None
    log_metrics: StrictBool | None = None
    no_logs: StrictBool | None = None
    custom_labels: dict[str, StrictStr] | None = None
    routing_key: StrictStr | None = None
    conversation_id: StrictStr | None = None
    external_trace_header: dict[str, Any] | None = None
    received_time: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in sorted(set(data) & set(UNSUPPORTED)):
                neutral, why = UNSUPPORTED[name]
                value = data[name]
                if not any(value is n or (type(value) is type(n) and value == n) for n in neutral):
                    raise ValueError(f"{name}={value!r} is not supported: {why}")
            data = {k: v for k, v in data.items() if k not in UNSUPPORTED}
        return data

    @model_validator(mode="after")
    def _consistent_batch(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of 'text' or 'input_ids'")
        prompts = self.text if self.text is not None else self.input_ids
        many = isinstance(self.text, list) or _ids_shape(self.input_ids) == "many"
        if many and not prompts:
            raise ValueError("the batch is empty")
        size = len(prompts) if many else 1
        for name in ("sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num"):
            value = getattr(self, name)
            if isinstance(value, list) and (not many or len(value) != size):
                what = f"a batch of {size}" if many else "a single prompt"
                raise ValueError(f"{name} has {len(value)} entries for {what}")
        for name in ("image_data", "audio_data"):
            value = getattr(self, name)
            if many and isinstance(value, list) and len(value) != size:
                raise ValueError(f"{name} has {len(value)} entries for a batch of {size}")
        if isinstance(self.rid, list):
            dups = sorted(r for r, c in Counter(self.rid).items() if c > 1)
            if dups:
                raise ValueError(f"duplicate rid(s) in one batch: {dups}")
        if self.data_parallel_rank is not None and self.routed_dp_rank is not None:
            if self.data_parallel_rank != self.routed_dp_rank:
                raise ValueError("data_parallel_rank and routed_dp_rank disagree")
        return self

    def to_input(self) -> GenerateReqInput:
        """The request as the tokenizer manager takes it (nulls resolved to the defaults)."""
        sp = self.sampling_params
        return GenerateReqInput(
            text=self.text,
            input_ids=self.input_ids,
            sampling_params=[p.to_dict() for p in sp] if isinstance(sp, list) else sp.to_dict() if sp else {},
            rid=self.rid,
            return_logprob=_default(self.return_logprob, False),
            logprob_start_len=_default(self.logprob_start_len, -1),
            top_logprobs_num=_default(self.top_logprobs_num, 0),
            return_text_in_logprobs=bool(self.return_text_in_logprobs),
            stream=bool(self.stream),
            image_data=self.image_data,
            audio_data=self.audio_data,
            data_parallel_rank=self.data_parallel_rank if self.data_parallel_rank is not None else self.routed_dp_rank,
        )


def _default(value: Any, default: Any) -> Any:
    if isinstance(value, list):
        return [default if v is None else v for v in value]
    return default if value is None else value
