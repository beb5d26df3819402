"""gen and select as /generate requests: build the body, read (or stream) the answer, parse it.

A prompt is either raw text (a program without roles: sent as `text`, as upstream does) or chat
token ids (sent as `input_ids`, because TMLv0 framing tokens have no text spelling the server
would encode back into them). Chat outputs are token ids run through the TMLv0 output parser.
Every request carries all the program's media so far (`image_data` / `audio_data`), one
placeholder token in the prompt per item.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang.lang.backend.base_backend import BaseBackend, SglServerError
from sglang.lang.chat import ChatTranscript
from sglang.lang.choices import ChoicesDecision, TokenLogprob, normalized_logprob
from sglang.lang.ir import SglSamplingParams
from sglang.lang.media import Media, request_fields


@dataclass
class GenPrompt:
    text: str | None = None  # raw program
    input_ids: list[int] | None = None  # chat program
    # Ids the parser must see before the generated ones: [] for an open turn, the text block's
    # `<|content_text|>` when the model continues a message. None: raw text, no parsing.
    parse_prefix: list[int] | None = None
    extra_stop_token_ids: list[int] = field(default_factory=list)
    media: list[Media] = field(default_factory=list)


@dataclass
class GenResult:
    text: str  # the variable's value: generated text, or the visible content of a chat turn
    meta_info: dict[str, Any]


def gen_prompt(chat: ChatTranscript | None, raw_text: str, media: Sequence[Media] = ()) -> GenPrompt:
    """What a gen continues: the raw text, the rendered conversation, or the open message's text block."""
    media = list(media)
    if chat is None:
        return GenPrompt(text=raw_text, media=media)
    if chat.in_open_turn:
        return GenPrompt(input_ids=chat.open_turn_prompt(), parse_prefix=[], media=media)
    # Inside a user/system message the text ends with the message, not with the turn.
    stops = [] if chat.role == "assistant" else [chat.end_message_id()]
    return GenPrompt(
        input_ids=chat.text_block_prompt(),
        parse_prefix=chat.text_block_opener(),
        extra_stop_token_ids=stops,
        media=media,
    )


def select_prompts(
    chat: ChatTranscript | None, raw_text: str, choices: list[str], has_media: bool = False
) -> tuple[list[int], list[list[int]]]:
    """The prompt's ids, and each prompt+choice tokenised as one text (see `run_select`)."""
    if chat is not None:
        return chat.text_block_prompt(), [chat.text_block_prompt(c) for c in choices]
    from sgl_inkling.chat.tokenizer import get_tokenizer

    tok = get_tokenizer()
    encode = tok.encode
    if has_media:
        # Placeholder spellings must become their single ids, as the server encodes a text prompt.
        from sglang.lang.media import processor

        proc = processor()

        def encode(text: str) -> list[int]:
            return proc.encode_text(text, tok)

    return encode(raw_text), [encode(raw_text + c) for c in choices]


def gen_body(prompt: GenPrompt, params: SglSamplingParams) -> dict[str, Any]:
    sampling = params.sampling_dict()
    if prompt.extra_stop_token_ids:
        sampling["stop_token_ids"] = [*(sampling.get("stop_token_ids") or []), *prompt.extra_stop_token_ids]
    body: dict[str, Any] = {"sampling_params": sampling, **params.request_dict()}
    if prompt.input_ids is not None:
        body["input_ids"] = prompt.input_ids
    else:
        body["text"] = prompt.text
    body.update(request_fields(prompt.media))
    return body


def _check_finish(meta: dict[str, Any]) -> None:
    reason = meta.get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise SglServerError(500, f"the server aborted the request: {reason.get('message', '')}")


def _trim_stop(text: str, meta: dict[str, Any]) -> str:
    """Cut a matched stop string (the server trims its text, but chat content is parsed from ids)."""
    reason = meta.get("finish_reason")
    matched = reason.get("matched") if isinstance(reason, dict) else None
    if isinstance(matched, str) and matched:
        cut = text.rfind(matched)
        if cut >= 0:
            return text[:cut]
    return text


def run_gen(
    backend: BaseBackend,
    prompt: GenPrompt,
    params: SglSamplingParams,
    stream: bool = False,
    on_text: Callable[[str], None] | None = None,
) -> GenResult:
    """Generate; when streaming, `on_text` gets the visible text so far, growing only."""
    body = gen_body(prompt, params)
    chunks = backend.generate_stream(body) if stream else [backend.generate(body)]
    parser = None
    if prompt.parse_prefix is not None:
        parser = ChatTranscript.parser()
        parser.feed(prompt.parse_prefix)
    # Text that may be the start of a stop string is held back until the request finishes: the
    # server trims a matched stop string only then, and what was shown cannot be taken back.
    holdback = max((len(s) for s in params.stop_strings), default=1) - 1
    visible, fed, shown = "", 0, 0
    last: dict[str, Any] = {}
    for chunk in chunks:
        last = chunk
        if parser is None:
            visible = chunk["text"]
        else:
            ids = chunk["output_ids"]
            visible += "".join(d.content or "" for d in parser.feed(ids[fed:]))
            fed = len(ids)
        if on_text is not None and chunk["meta_info"].get("finish_reason") is None:
            ready = len(visible) - holdback
            if ready > shown:
                on_text(visible[:ready])
                shown = ready
    meta = dict(last.get("meta_info", {}))
    _check_finish(meta)
    if parser is None:
        return GenResult(last.get("text", ""), meta)
    parser.finish()
    parsed = parser.result()
    meta["reasoning_content"] = parsed.reasoning_content
    meta["output_ids"] = list(last.get("output_ids", []))
    return GenResult(_trim_stop(parsed.content, meta), meta)


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_select(
    backend: BaseBackend,
    prompt_ids: list[int],
    choice_ids: list[list[int]],
    choices: list[str],
    choices_method: Callable[..., ChoicesDecision],
    media: Sequence[Media] = (),
) -> ChoicesDecision:
    """Score each choice by its tokens' log-probabilities after the prompt; let the method decide.

    `choice_ids[i]` is the whole prompt+choice tokenised together. Where the choice's first token
    merges with the prompt's last one, scoring starts at the first token that differs from the
    prompt alone, so every choice is scored on the tokens it really adds (upstream's token healing).
    """
    starts = [min(_common_prefix_len(prompt_ids, full), len(full) - 1) for full in choice_ids]
    if min(starts) < 1:
        # Token 0 has no log-probability: the choice must follow at least one prompt token.
        raise ValueError("select needs prompt text before the choices (a choice merged into the first token)")
    body = {
        "input_ids": choice_ids,
        "logprob_start_len": starts,
        "return_logprob": True,
        "return_text_in_logprobs": True,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
    }
    # A batch request: each choice's prompt carries the same media.
    body.update({k: [v] * len(choice_ids) for k, v in request_fields(media).items()})
    results = backend.generate(body)
    token_logprobs: list[list[TokenLogprob]] = []
    for full, start, res in zip(choice_ids, starts, results):
        entries = [tuple(e) for e in res["meta_info"]["input_token_logprobs"]]
        need = len(full) - start
        # The server counts `logprob_start_len` in its widened prompt (each media placeholder grown
        # to its patch/frame count), so with media it returns more entries; all media precede the
        # choice, so the choice's tokens are the last `need` entries either way.
        if len(entries) < need or (len(entries) > need and not media):
            raise SglServerError(500, f"expected {need} input logprobs, got {len(entries)}")
        entries = entries[len(entries) - need :]
        token_logprobs.append(entries)
    normalized = [normalized_logprob(t) for t in token_logprobs]
    decision = choices_method(
        choices=choices, normalized_prompt_logprobs=normalized, input_token_logprobs=token_logprobs
    )
    decision.meta_info.setdefault("normalized_prompt_logprobs", normalized)
    decision.meta_info["input_token_logprobs"] = token_logprobs
    return decision
