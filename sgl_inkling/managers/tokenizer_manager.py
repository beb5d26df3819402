"""The tokenizer manager (HTTP process, asyncio): validates and tokenizes requests, sends them to the
scheduler and hands each request the text and tokens the detokenizer sends back."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from sgl_inkling.constrained import GrammarError, GrammarSpec, native_grammar
from sgl_inkling.managers import io_struct as io
from sgl_inkling.managers.data_parallel_controller import check_dp_rank
from sgl_inkling.managers.metrics_collector import MetricsCollector
from sgl_inkling.managers.request_logger import RequestLogger
from sgl_inkling.multimodal.processor import media_processor
from sgl_inkling.sampling.sampling_params import MAX_N, MAX_TOP_LOGPROBS, SamplingParams, SamplingParamsError

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ReqState:
    prompt_tokens: int
    return_logprob: bool
    text_in_logprobs: bool
    no_stop_trim: bool = False
    stop_strs: tuple[str, ...] = ()
    created: float = dataclasses.field(default_factory=time.monotonic)
    text: str = ""
    output_ids: list[int] = dataclasses.field(default_factory=list)
    output_logprobs: list = dataclasses.field(default_factory=list)
    top_logprobs: list = dataclasses.field(default_factory=list)
    input_logprobs: list | None = None
    cached_tokens: int = 0
    spec: tuple[int, int] | None = None  # MTP (verify steps, accepted drafts)
    queue_time: float | None = None  # the scheduler's arrival-to-admission time
    finished_reason: dict | None = None
    stop_str: str | None = None
    event: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    last_disconnect_check: float = 0.0


class TokenizerManager:
    def __init__(self, server_args, info: dict, scheduler_addr: str, detok_out_addr: str):
        from sgl_inkling.chat.tokenizer import get_tokenizer

        self.server_args = server_args
        self.info = info
        self.model_name = server_args.served_model_name
        self.context_len = info["context_len"]
        self.vocab_size = info["vocab_size"]
        self.tokenizer = get_tokenizer(server_args.tokenizer_path)
        self.media = media_processor(server_args, info.get("media") or {})
        self.reasoning_parser = server_args.reasoning_parser
        self.tool_call_parser = server_args.tool_call_parser
        self.enable_cache_report = server_args.enable_cache_report
        self._scheduler_addr = scheduler_addr
        self._recv_addr = detok_out_addr
        self.rid_to_state: dict[str, ReqState] = {}
        self._control: asyncio.Queue | None = None
        self._control_lock: asyncio.Lock | None = None
        self._started = False
        self.num_requests = 0
        self.num_errors = 0
        # A model step failed (scheduler_faults): /health answers 503 until generation works again.
        self.model_fault: str | None = None
        self.num_model_faults = 0
        self.draining = False  # SIGTERM received (entrypoints/drain.py): refuse new requests
        # Watchers of every request (received / output / finished): --log-requests, --enable-metrics.
        self.metrics = MetricsCollector(self.model_name) if server_args.enable_metrics else None
        logger_ = RequestLogger(server_args.log_requests_level) if server_args.log_requests else None
        self.observers = [o for o in (self.metrics, logger_) if o is not None]

    # ---------------------------------------------------------------- plumbing

    async def start(self) -> None:
        """Open the sockets inside the running event loop (uvicorn's or the Engine's)."""
        if self._started:
            return
        ctx = zmq.asyncio.Context.instance()
        self.send_sock = ctx.socket(zmq.PUSH)
        self.send_sock.connect(self._scheduler_addr)
        self.recv_sock = ctx.socket(zmq.PULL)
        self.recv_sock.bind(self._recv_addr)
        self._control = asyncio.Queue()
        self._control_lock = asyncio.Lock()
        self._recv_task = asyncio.get_running_loop().create_task(self._recv_loop())
        self._started = True

    async def stop(self) -> None:
        if self._started:
            self._recv_task.cancel()
            self._started = False

    async def _recv_loop(self) -> None:
        while True:
            msg = await self.recv_sock.recv_pyobj()
            if isinstance(msg, io.BatchStrOut):
                self._dispatch(msg)
            else:
                await self._control.put(msg)

    def _dispatch(self, msg: io.BatchStrOut) -> None:
        t = msg.tokens
        for i, rid in enumerate(t.rids):
            st = self.rid_to_state.get(rid)
            if st is None:
                continue  # already abandoned by its client
            st.text += msg.new_texts[i]
            st.output_ids.extend(t.new_token_ids[i])
            st.cached_tokens = t.cached_tokens[i]
            if t.spec_verify_ct is not None:
                st.spec = (t.spec_verify_ct[i], t.spec_accepted_drafts[i])
            if t.queue_times is not None and t.queue_times[i] is not None:
                st.queue_time = t.queue_times[i]
            for o in self.observers:
                o.output(rid, st, len(t.new_token_ids[i]))
            if t.output_token_logprobs[i]:
                st.output_logprobs.extend(t.output_token_logprobs[i])
            if t.output_top_logprobs[i]:
                st.top_logprobs.extend(t.output_top_logprobs[i])
            if t.input_token_logprobs[i] is not None:
                st.input_logprobs = t.input_token_logprobs[i]
            if t.finished_reasons[i] is not None and st.finished_reason is None:  # finish_all may have
                st.finished_reason = t.finished_reasons[i]
                if st.finished_reason.get("fault") == io.MODEL_STEP_FAULT:
                    self.model_fault = st.finished_reason.get("message") or "model step failed"
                    self.num_model_faults += 1
                st.stop_str = t.stop_strs[i]
            st.event.set()

    async def _control_call(self, req) -> Any:
        async with self._control_lock:
            await self.send_sock.send_pyobj(req)
            return await asyncio.wait_for(self._control.get(), timeout=60)

    async def get_internal_state(self) -> dict:
        return (await self._control_call(io.GetInternalStateReq())).state

    async def flush_cache(self) -> io.FlushCacheResp:
        return await self._control_call(io.FlushCacheReq())

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """Stop one request, or every request with abort_all; an unknown rid is a no-op."""
        if abort_all or rid in self.rid_to_state:
            self.send_sock.send_pyobj(io.AbortReq(rid, abort_all=abort_all))

    def finish_all(self, message: str, status: int) -> None:
        """End every request now with an error finish (its client gets the status), and have the
        scheduler stop them and free their slots."""
        for st in self.rid_to_state.values():
            if st.finished_reason is None:
                st.finished_reason = {"type": "abort", "message": message, "status_code": status}
                st.event.set()
        self.abort_request(abort_all=True)

    # ---------------------------------------------------------------- requests

    async def generate_request(
        self, obj: io.GenerateReqInput, request=None, incremental: bool = False
    ) -> AsyncIterator[Any]:
        """Yield cumulative result dicts (see the OpenAI layer's protocol); raise RequestError if invalid.
        incremental (--incremental-streaming-output, for /generate and the Engine): a stream's chunks
        carry only what is new since the previous one (text, output ids, output logprobs; the input
        logprobs in the first), as upstream."""
        self.num_requests += 1
        if self.draining:
            raise io.RequestError("the server is shutting down", 503)
        if obj.is_batch or self._n(obj) > 1:
            if obj.stream:
                raise io.RequestError("streaming is not supported for batch requests or n > 1")
            items = self._expand(obj)
            tokenized = [self._tokenize(item) for item in items]  # validate all before sending any
            results = await asyncio.gather(*(self._run_one(t, item, request) for t, item in tokenized))
            yield results
            return
        tok, item = self._tokenize(obj)
        if not obj.stream:
            yield await self._run_one(tok, item, request)
            return
        async for out in self._stream_one(tok, item, request, incremental):
            yield out

    def _n(self, obj: io.GenerateReqInput) -> int:
        """Parallel samples asked for (the HTTP layer has validated it; the Engine's callers are
        checked here, never coerced)."""
        sp = obj.sampling_params
        n = sp.get("n", 1) if isinstance(sp, dict) else 1
        n = 1 if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise io.RequestError(f"sampling_params.n must be an integer in [1, {MAX_N}], got {n!r}")
        return n

    def _expand(self, obj: io.GenerateReqInput) -> list[io.GenerateReqInput]:
        out = []
        for i in range(obj.batch_size()):
            item = obj.item(i)
            n = self._n(item)
            for _ in range(n):
                copy_ = copy.copy(item)
                copy_.sampling_params = {k: v for k, v in (item.sampling_params or {}).items() if k != "n"}
                copy_.rid = None if n > 1 else item.rid
                out.append(copy_)
        if isinstance(obj.rid, str):  # one rid for many requests is their prefix (as SGLang)
            for k, copy_ in enumerate(out):
                copy_.rid = f"{obj.rid}_{k}"
        return out

    def _tokenize(self, obj: io.GenerateReqInput) -> tuple[io.TokenizedGenerateReq, io.GenerateReqInput]:
        if (obj.text is None) == (obj.input_ids is None):
            raise io.RequestError("give exactly one of 'text' or 'input_ids'")
        has_media = obj.image_data is not None or obj.audio_data is not None
        if obj.text is not None:
            if not isinstance(obj.text, str):
                raise io.RequestError("'text' must be a string or a list of strings")
            input_ids = self.media.encode_text(obj.text, self.tokenizer) if has_media else self.tokenizer.encode(obj.text)
        else:
            input_ids = obj.input_ids
            if not isinstance(input_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in input_ids
            ):
                raise io.RequestError("'input_ids' must be a list of integers (or a list of such lists)")
            bad = [t for t in input_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise io.RequestError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        mm_items = obj.mm_items
        if has_media:
            input_ids, mm_items = self.media.expand_request(input_ids, obj.image_data, obj.audio_data)
        if not input_ids:
            raise io.RequestError("the prompt is empty")
        if len(input_ids) >= self.context_len:
            raise io.RequestError(
                f"the prompt has {len(input_ids)} tokens; the context length is {self.context_len}"
            )
        sp_dict = obj.sampling_params if obj.sampling_params is not None else {}
        if not isinstance(sp_dict, dict):
            raise io.RequestError("'sampling_params' must be an object")
        try:
            sp = SamplingParams.from_dict({k: v for k, v in sp_dict.items() if k != "n"})
            sp.validate(self.context_len - len(input_ids), vocab_size=self.vocab_size)
        except SamplingParamsError as e:
            raise io.RequestError(str(e)) from None
        grammar = self._grammar(obj, sp, input_ids)
        if sp.max_new_tokens is None:
            sp.max_new_tokens = self.context_len - len(input_ids)  # None: bounded by the context
        if len(input_ids) + sp.max_new_tokens > self.context_len:
            raise io.RequestError(
                f"prompt ({len(input_ids)} tokens) + max_new_tokens ({sp.max_new_tokens}) exceeds the "
                f"context length {self.context_len}"
            )
        for name in ("return_logprob",):
            if not isinstance(getattr(obj, name), bool):
                raise io.RequestError(f"'{name}' must be a boolean")
        top_n, start = obj.top_logprobs_num, obj.logprob_start_len
        if isinstance(top_n, bool) or not isinstance(top_n, int) or not 0 <= top_n <= MAX_TOP_LOGPROBS:
            raise io.RequestError(f"'top_logprobs_num' must be an integer in [0, {MAX_TOP_LOGPROBS}]")
        if not isinstance(start, int) or start >= len(input_ids):
            raise io.RequestError(
                f"'logprob_start_len' must be an integer below the prompt length {len(input_ids)}"
            )
        rid = obj.rid if isinstance(obj.rid, str) and obj.rid else io.new_rid()
        if rid in self.rid_to_state:
            raise io.RequestError(f"request id {rid!r} is already in use")
        stop_ids = [] if sp.ignore_eos else list(self.tokenizer.eos_token_ids)
        dp_rank = check_dp_rank(obj.data_parallel_rank, self.server_args.dp_size)
        tok = io.TokenizedGenerateReq(
            rid=rid,
            input_ids=list(input_ids),
            sampling_params=sp,
            return_logprob=obj.return_logprob or top_n > 0,
            logprob_start_len=start,
            top_logprobs_num=top_n,
            stream=obj.stream,
            stop_token_ids=stop_ids,
            grammar=grammar,
            mm_items=mm_items or None,
            data_parallel_rank=dp_rank,
        )
        return tok, obj

    def _grammar(
        self, obj: io.GenerateReqInput, sp: SamplingParams, input_ids: list[int]
    ) -> GrammarSpec | None:
        """The request's grammar: the chat layer's, or one from json_schema/regex/ebnf (validated here,
        so a bad one is a 400 and never reaches the scheduler)."""
        if obj.grammar is not None and not isinstance(obj.grammar, GrammarSpec):
            raise io.RequestError(
                "'grammar' is not a request field; use sampling_params json_schema/regex/ebnf"
            )
        try:
            grammar = obj.grammar or native_grammar(self.tokenizer, sp, input_ids)
        except GrammarError as e:
            raise io.RequestError(str(e)) from None
        if grammar is not None and getattr(self.server_args, "grammar_backend", None) == "none":
            raise io.RequestError("constrained decoding is off on this server (--grammar-backend none)")
        return grammar

    def _register(self, tok: io.TokenizedGenerateReq, obj: io.GenerateReqInput) -> ReqState:
        sp = tok.sampling_params
        st = ReqState(
            prompt_tokens=len(tok.input_ids),
            return_logprob=tok.return_logprob,
            text_in_logprobs=obj.return_text_in_logprobs,
            no_stop_trim=sp.no_stop_trim,
            stop_strs=tuple(s for s in sp.stop_strs if s),
        )
        self.rid_to_state[tok.rid] = st
        for o in self.observers:
            o.received(tok, obj, st)
        self.send_sock.send_pyobj(tok)
        return st

    async def _wait(self, rid: str, st: ReqState, request) -> None:
        """Wait for news about the request; abort it when the client goes away.

        Outputs arrive every step, so the disconnect check runs on a clock, not on idle timeouts.
        """
        while True:
            now = time.monotonic()
            if request is not None and now - st.last_disconnect_check > 0.5:
                st.last_disconnect_check = now
                if await request.is_disconnected():
                    self.abort_request(rid)
                    raise asyncio.CancelledError
            try:
                await asyncio.wait_for(st.event.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            st.event.clear()
            return

    async def _run_one(self, tok, obj, request) -> dict:
        st = self._register(tok, obj)
        try:
            while st.finished_reason is None:
                await self._wait(tok.rid, st, request)
            return self._result(tok.rid, st)
        finally:
            self._forget(tok.rid, st)

    async def _stream_one(self, tok, obj, request, incremental: bool = False) -> AsyncIterator[dict]:
        st = self._register(tok, obj)
        sent_ids = sent_chars = 0  # incremental: what earlier chunks carried
        try:
            while True:
                # The scheduler spaces the chunks (stream_interval: Scheduler._output_due).
                await self._wait(tok.rid, st, request)
                out = self._result(tok.rid, st, since=sent_ids if incremental else 0)
                if st.finished_reason is None and st.stop_strs:
                    out["text"] = out["text"][: _safe_len(out["text"], st.stop_strs)]
                if incremental:  # never held back text past a stop string: the final cut is after it
                    sent_ids, text = len(st.output_ids), out["text"]
                    out["text"], sent_chars = text[sent_chars:], max(sent_chars, len(text))
                yield out
                if st.finished_reason is not None:
                    return
        finally:
            self._forget(tok.rid, st)

    def _forget(self, rid: str, st: ReqState) -> None:
        if st.finished_reason is None:
            self.abort_request(rid)  # the consumer stopped early (disconnect, cancellation)
        self.rid_to_state.pop(rid, None)
        if self.observers:
            result = self._result(rid, st)
            for o in self.observers:
                o.finished(rid, st, result)

    def _result(self, rid: str, st: ReqState, since: int = 0) -> dict:
        """The request's output; with `since`, output ids and logprobs from that token on (and the input
        logprobs only when since is 0: an incremental stream's first chunk)."""
        text = st.text
        if st.stop_str and st.finished_reason is not None:
            # As SGLang: cut at the first occurrence of the matched stop, before it by default, after
            # it with no_stop_trim (text decoded past the stop in the same step is dropped either way).
            cut = text.find(st.stop_str)
            if cut >= 0:
                text = text[: cut + len(st.stop_str)] if st.no_stop_trim else text[:cut]
        elif not st.no_stop_trim and isinstance((st.finished_reason or {}).get("matched"), int):
            # A matched stop token's text is not part of the answer either (its id stays in output_ids).
            spelled = self.tokenizer.decode([st.finished_reason["matched"]])
            if spelled and text.endswith(spelled):
                text = text[: -len(spelled)]
        meta: dict[str, Any] = {
            "id": rid,
            "prompt_tokens": st.prompt_tokens,
            "completion_tokens": len(st.output_ids),
            "cached_tokens": st.cached_tokens,
            "finish_reason": st.finished_reason,
            "e2e_latency": time.monotonic() - st.created,
        }
        if st.spec is not None:
            steps, accepted = st.spec
            meta["spec_verify_ct"] = steps
            meta["spec_accepted_drafts"] = accepted
            # Tokens per verify step (accepted drafts + the trunk's own token), SGLang's accept length.
            meta["spec_accept_length"] = (steps + accepted) / steps if steps else 0.0
        if st.return_logprob:
            meta["output_token_logprobs"] = [self._lp(v, t, st) for v, t in st.output_logprobs[since:]]
            meta["output_top_logprobs"] = [[self._lp(v, t, st) for v, t in pos] for pos in st.top_logprobs[since:]]
            inputs = (st.input_logprobs or []) if since == 0 else []
            meta["input_token_logprobs"] = [self._lp(v, t, st) for v, t in inputs]
        return {"text": text, "output_ids": st.output_ids[since:], "meta_info": meta}

    def _lp(self, value, token_id: int, st: ReqState) -> tuple:
        text = self.tokenizer.decode([token_id]) if st.text_in_logprobs else None
        return (value, token_id, text)


def _safe_len(text: str, stops: tuple[str, ...]) -> int:
    """How much of an unfinished stream's text may be sent: not a tail that could still grow into a
    stop string (the final text is cut before it, so what was streamed must not contain it)."""
    keep = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                keep = min(keep, len(text) - k)
                break
    return keep
