"""The scheduler process: continuous batching with chunked prefill, admission by memory, retraction.

It receives TokenizedGenerateReq from the tokenizer manager, runs the model through the ModelRunner
and sends BatchTokenOut to the detokenizer (control replies take the same route).
"""

from __future__ import annotations

import gc
import logging
from collections import deque

import zmq

from sgl_inkling.constrained.scheduler_hooks import create_backend, grammar_stats
from sgl_inkling.managers import io_struct as io
from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.managers.schedule_policy import SchedulePolicy
from sgl_inkling.managers.scheduler_faults import FaultIsolationMixin
from sgl_inkling.managers.scheduler_log import DecodeLog
from sgl_inkling.managers.scheduler_memory import log_memory, size_pools
from sgl_inkling.managers.scheduler_overlap import OverlapDecodeMixin
from sgl_inkling.managers.scheduler_prefill import PrefillMixin
from sgl_inkling.managers.scheduler_sampling import SamplingMixin
from sgl_inkling.managers.scheduler_spec import SpecDecodeMixin
from sgl_inkling.managers.watchdog import Watchdog, exit_on_hang
from sgl_inkling.mem_cache.req_kv import ReqKVManager
from sgl_inkling.model_executor.model_loader import load_model
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.sampling.sampler import Sampler

logger = logging.getLogger(__name__)


class Scheduler(OverlapDecodeMixin, SamplingMixin, PrefillMixin, SpecDecodeMixin, FaultIsolationMixin):
    def __init__(self, server_args, model_path: str, recv_addr: str, send_addr: str):
        self.args = server_args
        from sgl_inkling.chat.tokenizer import get_tokenizer

        self.tokenizer = get_tokenizer(server_args.tokenizer_path)
        device, dtype = server_args.resolved_device(), server_args.resolved_dtype()
        model = load_model(
            model_path, dtype, device, server_args.load_format, enable_multimodal=server_args.enable_multimodal,
            quantization=server_args.quantization, need_mtp=server_args.speculative_algorithm is not None,
            draft_quantization=server_args.speculative_draft_model_quantization,
        )  # fmt: skip
        cfg = model.cfg
        dev = next(model.parameters()).device
        log_memory("weights loaded", dev)
        self.context_len = server_args.context_length or cfg.max_position_embeddings
        sizes = size_pools(model, server_args, self.context_len)
        spec_steps = server_args.speculative_num_steps or model.num_mtp_layers
        spec_on = server_args.speculative_algorithm is not None
        self.runner = ModelRunner(
            model,
            sizes.max_running_requests,
            self.context_len + 8 + (spec_steps + 1 if spec_on else 0),  # drafts run past the end
            sizes.max_total_tokens,
            sizes.max_swa_tokens,
            server_args.attention_backend,
            cuda_graph_max_bs=0 if server_args.disable_cuda_graph else server_args.cuda_graph_max_bs,
            cuda_graph_bs=server_args.cuda_graph_bs,
        )
        self.sizes = sizes
        log_memory(f"KV pools ({sizes.max_total_tokens} full, {sizes.max_swa_tokens} sliding tokens) and decode graphs", dev)
        self.vocab = cfg.unpadded_vocab_size
        self.grammar = create_backend(server_args, self.tokenizer, self.vocab)
        if self.grammar is not None:
            self.grammar.masker.warm_up(dev, sizes.max_running_requests)
        self.spec = None
        if spec_on:  # before the prefix cache: its checkpoints copy the depths' carried state too
            from sgl_inkling.speculative.mtp_worker import MTPWorker
            from sgl_inkling.speculative.token_map import load_token_map

            path = server_args.speculative_token_map
            self.spec = MTPWorker(
                self.runner,
                server_args.speculative_num_steps,
                self.grammar,
                adaptive=server_args.speculative_adaptive,
                token_map=load_token_map(path, model.cfg.unpadded_vocab_size) if path else None,
                capture=False,  # below, once the prefix cache's checkpoints are allocated
            )
        chunk = server_args.chunked_prefill_size
        self.chunk_budget = chunk if chunk and chunk > 0 else server_args.max_prefill_tokens
        # Decode tokens ride on prefill chunks (scheduler_prefill.py); never with MTP (server_args refuses it).
        self.mixed_chunk = bool(server_args.enable_mixed_chunk) and not spec_on
        self.mixed_counts = {"num_mixed_steps": 0, "num_mixed_decode_tokens": 0}
        self.kv = ReqKVManager(
            self.runner,
            cfg.sliding_window_size,
            enable_cache=not server_args.disable_radix_cache,
            num_checkpoints=sizes.num_checkpoints,
            interval=sizes.checkpoint_interval,
        )
        log_memory(f"prefix cache ({sizes.num_checkpoints} conv checkpoints)", dev)
        if self.spec is not None:  # its graphs take what is left after every pool
            self.spec.capture_graphs()
            log_memory("MTP verify and draft graphs", dev)
        self.policy = SchedulePolicy(server_args.schedule_policy, self.kv.radix)
        self.sampler = Sampler(server_args.random_seed, return_original_logprob=True)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.partial: list[Req] = []  # prefill begun, not finished: they hold memory, so go first
        self.outbox: list[Req] = []
        self.step_reqs: list[Req] = []  # the step in progress: its requests fail with it
        self.step_allocs: dict[Req, int] = {}  # KV slots allocated past kv_len for that step
        self.num_retracted = 0
        self.num_finished = 0
        self.num_generated_tokens = 0  # committed output tokens (the decode log's throughput)
        self.decode_log = DecodeLog(server_args.decode_log_interval)
        self.stream_interval = server_args.stream_interval
        self.watchdog = Watchdog(server_args.watchdog_timeout, exit_on_hang)
        self.init_overlap(server_args)

        ctx = zmq.Context.instance()
        self.recv_sock = ctx.socket(zmq.PULL)
        self.recv_sock.bind(recv_addr)
        self.send_sock = ctx.socket(zmq.PUSH)
        self.send_sock.connect(send_addr)

    def ready_info(self) -> dict:
        return {
            "max_total_num_tokens": self.sizes.max_total_tokens,
            "max_swa_tokens": self.sizes.max_swa_tokens,
            "max_running_requests": self.sizes.max_running_requests,
            "context_len": self.context_len,
            "vocab_size": self.vocab,
            "device": str(self.runner.device),
            "dtype": str(self.runner.dtype).replace("torch.", ""),
            "media": {
                "modalities": list(self.runner.model.modalities),
                "image_token_id": self.runner.model.config.image_token_id,
                "audio_token_id": self.runner.model.config.audio_token_id,
            },
        }

    # ---------------------------------------------------------------- loop

    def event_loop(self) -> None:
        while True:
            idle = not (self.waiting or self.running or self.partial)
            if idle:
                self.decode_log.idle()
            self.recv_requests(block=idle)
            try:
                with self.watchdog.step():
                    self.step()
            except Exception as e:  # a failure costs the requests of that step, not the server
                self.fail_step(e)
            self.flush_outbox()

    def step(self) -> None:
        self.step_reqs, self.step_allocs = [], {}
        pending = self.pending
        if (self.waiting or self.partial) and self.run_prefill():
            if self.pending is pending:  # a synchronous prefill read its tokens back: commit the pending step
                self.commit_pending()  # (an overlapped prefill committed it and left its own)
            return
        if self.running:
            self.run_decode()
            self.decode_log.after_decode_step(self)

    def recv_requests(self, block: bool) -> None:
        flags = 0 if block else zmq.NOBLOCK
        while True:
            try:
                msg = self.recv_sock.recv_pyobj(flags)
            except zmq.Again:
                return
            self.handle(msg)
            flags = zmq.NOBLOCK

    def handle(self, msg) -> None:
        if isinstance(msg, io.TokenizedGenerateReq):
            self.add_request(msg)
        elif isinstance(msg, io.AbortReq):
            self.abort(msg.rid, msg.abort_all)
        elif isinstance(msg, io.FlushCacheReq):
            self.send_sock.send_pyobj(self.flush_cache())
        elif isinstance(msg, io.GetInternalStateReq):
            self.send_sock.send_pyobj(io.InternalState(self.internal_state()))
        else:
            logger.warning("scheduler ignored unknown message %r", type(msg))

    def flush_cache(self) -> io.FlushCacheResp:
        if self.waiting or self.running or self.partial:
            return io.FlushCacheResp(False, "cannot flush the cache while requests are running")
        if self.kv.radix is not None:
            self.kv.radix.flush()
        return io.FlushCacheResp(True)

    def internal_state(self) -> dict:
        return {
            **self.kv.stats(),
            **self.ready_info(),
            "num_running_reqs": len(self.running) + len(self.partial),
            "num_waiting_reqs": len(self.waiting),
            "num_retracted_reqs": self.num_retracted,
            "num_finished_reqs": self.num_finished,
            "gc_frozen_objects": gc.get_freeze_count(),  # start-up objects out of collections (gc_control.py)
            "enable_mixed_chunk": self.mixed_chunk,
            **self.mixed_counts,
            **grammar_stats(self.grammar),
            **self.overlap_stats(),
            **(self.spec.stats() if self.spec is not None else {}),
        }

    # ---------------------------------------------------------------- decode

    def make_room(self, per_req: int) -> bool:
        """Retract until a step taking `per_req` new KV slots per running request fits. False when
        even a lone request does not fit: it is aborted and nothing runs this step."""
        while not self.kv.ensure(per_req * len(self.running), per_req * len(self.running)):
            if len(self.running) == 1:
                if self.partial:  # a prompt's chunks took the room: that prompt waits, not the one decoding
                    self.retract_partial()
                    continue
                req = self.running.pop()
                self.finish(req, {"type": "abort", "message": "out of KV memory"})
                return False
            self.retract_one()
        return True

    def retract_partial(self) -> None:
        """Put the newest partial prefill back to wait (its chunks stay cached), as retract_one does a
        running request; prompt logprobs it gathered are gathered again when it resumes (a request
        that wants them resumes no later than logprob_start_len)."""
        victim = self.partial.pop()
        self.kv.cache_prefix(victim)
        self.kv.free(victim)
        victim.input_lp_partial = []
        victim.num_retractions += 1
        self.num_retracted += 1
        self.waiting.appendleft(victim)
        logger.info("retracted partial prefill %s to free KV memory for decode", victim.rid)

    def retract_one(self) -> None:
        """Free the request that has made the least progress; it is re-prefilled later, not failed."""
        victim = min(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
        self.running.remove(victim)
        self.kv.cache_prefix(victim)  # its work stays cached: resuming re-prefills almost nothing
        self.kv.free(victim)
        victim.num_retractions += 1
        self.num_retracted += 1
        self.waiting.appendleft(victim)
        logger.info("retracted request %s to free KV memory", victim.rid)

    # ---------------------------------------------------------------- output

    def finish(self, req: Req, reason: dict) -> None:
        req.finished_reason = reason
        self.settle_depths(req)  # MTP: depths behind plain decode steps catch up before the cache takes the state
        self.kv.cache_prefix(req)  # multi-turn continuations resume at the end of this request
        self.kv.free(req)
        self.num_finished += 1
        self.outbox.append(req)

    def abort(self, rid: str, abort_all: bool = False) -> None:
        pool = list(self.waiting) + self.running + self.partial
        for req in pool:
            if not abort_all and req.rid != rid:
                continue
            if req in self.waiting:
                self.waiting.remove(req)
            if req in self.running:
                self.running.remove(req)
            if req in self.partial:
                self.partial.remove(req)
            self.finish(req, {"type": "abort", "message": "aborted"})
        self.flush_outbox()

    def _output_due(self, req: Req) -> bool:
        """Upstream's streaming rule: a finished request always goes out; a streamed one with its first
        token, then once --stream-interval tokens are unsent; an unstreamed one with its first token, then
        every 50 (its client sees only the end). Unsent tokens wait in new_tokens."""
        if req.finished_reason is not None:
            return True
        unsent = len(req.new_tokens)
        if not req.stream:
            return unsent >= 50 or unsent == len(req.output_ids)  # the first token: its time is the TTFT
        interval = getattr(req.sampling_params, "stream_interval", None) or self.stream_interval
        return unsent > 0 and (unsent >= interval or unsent == len(req.output_ids))

    def flush_outbox(self) -> None:
        if not self.outbox:
            return
        reqs = [r for r in dict.fromkeys(self.outbox) if self._output_due(r)]  # once per request
        self.outbox.clear()
        if not reqs:
            return
        msg = io.BatchTokenOut(
            rids=[r.rid for r in reqs],
            new_token_ids=[r.new_tokens for r in reqs],
            finished_reasons=[r.finished_reason for r in reqs],
            prompt_tokens=[len(r.origin_input_ids) for r in reqs],
            completion_tokens=[len(r.output_ids) for r in reqs],
            cached_tokens=[r.cached_tokens for r in reqs],
            skip_special_tokens=[r.sampling_params.skip_special_tokens for r in reqs],
            output_token_logprobs=[r.new_logprobs if r.return_logprob else None for r in reqs],
            output_top_logprobs=[r.new_top_logprobs if r.top_logprobs_num else None for r in reqs],
            input_token_logprobs=[r.input_logprobs if r.finished or r.new_tokens else None for r in reqs],
            stop_strs=[r.stop_str for r in reqs],
            spec_verify_ct=[r.spec_verify_ct for r in reqs] if self.spec is not None else None,
            spec_accepted_drafts=[r.spec_accepted_drafts for r in reqs] if self.spec is not None else None,
            queue_times=[r.queue_time for r in reqs],
        )
        self.send_sock.send_pyobj(msg)
        for r in reqs:
            r.new_tokens, r.new_logprobs, r.new_top_logprobs = [], [], []
