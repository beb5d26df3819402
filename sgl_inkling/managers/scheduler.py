"""The scheduler process: continuous batching with chunked prefill, admission by memory, retraction.

It receives TokenizedGenerateReq from the tokenizer manager, runs the model through the ModelRunner
and sends BatchTokenOut to the detokenizer (control replies take the same route).
"""

from __future__ import annotations

import logging
import time
from collections import deque

import torch
import zmq

from sgl_inkling.constrained.scheduler_hooks import (
    after_token,
    apply_grammar_masks,
    create_backend,
    grammar_stats,
)
from sgl_inkling.managers import io_struct as io
from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.managers.schedule_policy import SchedulePolicy
from sgl_inkling.managers.scheduler_faults import FaultIsolationMixin
from sgl_inkling.managers.scheduler_memory import size_pools
from sgl_inkling.managers.scheduler_spec import SpecDecodeMixin
from sgl_inkling.managers.watchdog import Watchdog, exit_on_hang
from sgl_inkling.mem_cache.req_kv import ReqKVManager
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.model_executor.model_loader import load_model
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.step_faults import model_step
from sgl_inkling.multimodal.embed import extend_input_embeds
from sgl_inkling.sampling.sampler import Sampler
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo

logger = logging.getLogger(__name__)


class Scheduler(SpecDecodeMixin, FaultIsolationMixin):
    def __init__(self, server_args, model_path: str, recv_addr: str, send_addr: str):
        self.args = server_args
        from sgl_inkling.chat.tokenizer import get_tokenizer

        self.tokenizer = get_tokenizer(server_args.tokenizer_path)
        device, dtype = server_args.resolved_device(), server_args.resolved_dtype()
        model = load_model(
            model_path, dtype, device, server_args.load_format, enable_multimodal=server_args.enable_multimodal,
            quantization=server_args.quantization, need_mtp=server_args.speculative_algorithm is not None,
        )  # fmt: skip
        cfg = model.cfg
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
        )
        self.sizes = sizes
        self.vocab = cfg.unpadded_vocab_size
        self.grammar = create_backend(server_args, self.tokenizer, self.vocab)
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
            )
        chunk = server_args.chunked_prefill_size
        self.chunk_budget = chunk if chunk and chunk > 0 else server_args.max_prefill_tokens
        self.kv = ReqKVManager(
            self.runner,
            cfg.sliding_window_size,
            enable_cache=not server_args.disable_radix_cache,
            num_checkpoints=sizes.num_checkpoints,
            interval=sizes.checkpoint_interval,
        )
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
        self.stream_interval = server_args.stream_interval
        self.watchdog = Watchdog(server_args.watchdog_timeout, exit_on_hang)

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
            self.recv_requests(block=not (self.waiting or self.running or self.partial))
            try:
                with self.watchdog.step():
                    self.step()
            except Exception as e:  # a failure costs the requests of that step, not the server
                self.fail_step(e)
            self.flush_outbox()

    def step(self) -> None:
        self.step_reqs, self.step_allocs = [], {}
        if (self.waiting or self.partial) and self.run_prefill():
            return
        if self.running:
            self.run_decode()

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
            **grammar_stats(self.grammar),
            **(self.spec.stats() if self.spec is not None else {}),
        }

    # ---------------------------------------------------------------- prefill

    def run_prefill(self) -> bool:
        """Continue partially prefilled requests, then admit waiting ones, within the token and memory budget."""
        budget = self.chunk_budget
        batch: list[tuple[Req, int, tuple]] = []
        # Keep one decode step's slots per running request free so admission never forces a retraction.
        per_req = self.spec.num_steps + 1 if self.spec is not None else 1
        reserve = per_req * len(self.running)
        for req in self.partial + self.policy.order(self.waiting):
            if budget <= 0:
                break
            self.step_reqs = [r for r, _, _ in batch] + [req]
            fresh = req.row is None
            if fresh:
                if not self._fits_at_all(req):
                    self._remove_waiting(req)
                    self.finish(
                        req,
                        {"type": "abort", "message": "the request needs more KV memory than the server has"},
                    )
                    continue
                if not self.kv.admit(req):
                    break
            n = min(len(req.fill_ids) - req.kv_len, budget)
            locs = self.kv.alloc(req, n) if self.kv.ensure(n + reserve, n + reserve) else None
            if locs is None:
                if fresh:
                    self.kv.free(req)  # give back the row and the prefix lock; it stays waiting
                break
            self._remove_waiting(req)
            self.step_allocs[req] = n
            if req.queue_time is None:
                req.queue_time = time.monotonic() - req.arrival
            batch.append((req, n, locs))
            budget -= n
            reserve += per_req
        self.step_reqs = [r for r, _, _ in batch]
        if not batch:
            return False
        scheduled = {id(r) for r, _, _ in batch}
        self.partial = [r for r in self.partial if id(r) not in scheduled]  # forward_extend re-adds
        self.forward_extend(batch)
        return True

    def _fits_at_all(self, req: Req) -> bool:
        return len(req.fill_ids) + 1 <= self.kv.full.num_slots

    def _remove_waiting(self, req: Req) -> None:
        try:
            self.waiting.remove(req)
        except ValueError:
            pass

    def forward_extend(self, batch: list[tuple[Req, int, tuple]]) -> None:
        tokens, counts = [], []
        for req, n, _ in batch:
            tokens.append(req.fill_ids[req.kv_len : req.kv_len + n])
            counts.append(n if req.wants_input_logprobs else 1)
        fb = ForwardBatch.build(
            ForwardMode.EXTEND,
            tokens,
            [r.row for r, _, _ in batch],
            [r.kv_len for r, _, _ in batch],
            torch.cat([loc[0] for _, _, loc in batch]).tolist(),
            torch.cat([loc[1] for _, _, loc in batch]).tolist(),
            self.runner.device,
            logits_counts=counts,
        )
        fb.input_embeds = extend_input_embeds(self.runner.model, [(r, r.kv_len, n) for r, n, _ in batch], fb.input_ids)
        if self.kv.radix is not None:
            fb.sconv_snapshots = {i: self.kv.snapshot_plan(r, n) for i, (r, n, _) in enumerate(batch)}
            fb.sconv_checkpoints = self.kv.radix.ckpts
        out = self.runner.forward(fb)
        logits = out.logits
        if self.spec is not None:
            starts = torch.cumsum(torch.tensor([0] + [n for _, n, _ in batch]), 0).tolist()
            with model_step():
                self.spec.after_extend(
                    [(r, n, out.hidden[starts[i] : starts[i] + n], fb.sconv_snapshots.get(i, []))
                     for i, (r, n, _) in enumerate(batch)],
                    self.kv.radix.ckpts if self.kv.radix is not None else None,
                )  # fmt: skip
        done, done_logits, offset = [], [], 0
        for (req, n, _), k in zip(batch, counts):
            rows = logits[offset : offset + k]
            offset += k
            if req.wants_input_logprobs:
                self._collect_input_logprobs(req, rows, n)
            req.kv_len += n
            self.step_allocs.pop(req, None)
            self.kv.after_extend(req)
            if req.kv_len == len(req.fill_ids) and req.sampling_params.max_new_tokens == 0:
                self.finish(req, {"type": "length", "length": 0})  # prompt logprobs only (e.g. select)
            elif req.kv_len == len(req.fill_ids):
                done.append(req)
                done_logits.append(rows[-1])
            else:
                self.partial.append(req)
        if done:
            self.sample_and_advance(done, torch.stack(done_logits))
            self.running.extend(r for r in done if not r.finished)
            if self.spec is not None:
                self.start_drafting([r for r in done if not r.finished])

    def _collect_input_logprobs(self, req: Req, rows: torch.Tensor, n: int) -> None:
        """Logprob of each prompt token from logprob_start_len, from the logits one position earlier."""
        acc = req.input_lp_partial
        prompt = req.origin_input_ids
        start = req.logprob_start_len
        if req.kv_len <= start < req.kv_len + n and start == 0:
            acc.append((None, prompt[0]))
        lp = torch.log_softmax(rows.float(), dim=-1)
        for j in range(n):
            pos = req.kv_len + j  # logits at pos predict token pos + 1
            nxt = pos + 1
            if start <= nxt < len(prompt):
                acc.append((float(lp[j, prompt[nxt]]), prompt[nxt]))
        if req.kv_len + n >= len(prompt):
            req.input_logprobs = acc

    # ---------------------------------------------------------------- decode

    def run_decode(self) -> None:
        if self.spec is not None:
            self.run_spec_decode()
            return
        if not self.make_room(1):
            return
        reqs = self.step_reqs = list(self.running)
        locs = [self.kv.alloc(r, 1) for r in reqs]
        self.step_allocs = dict.fromkeys(reqs, 1)
        fb = ForwardBatch.build(
            ForwardMode.DECODE,
            [[r.fill_ids[r.kv_len]] for r in reqs],
            [r.row for r in reqs],
            [r.kv_len for r in reqs],
            [int(f) for f, _ in locs],
            [int(s) for _, s in locs],
            self.runner.device,
        )
        logits = self.runner.forward(fb).logits
        self.step_allocs = {}
        for r in reqs:
            r.kv_len += 1
            self.kv.release_window(r)
        self.sample_and_advance(reqs, logits)
        self.running = [r for r in self.running if not r.finished]

    def make_room(self, per_req: int) -> bool:
        """Retract until a step taking `per_req` new KV slots per running request fits. False when
        even a lone request does not fit: it is aborted and nothing runs this step."""
        while not self.kv.ensure(per_req * len(self.running), per_req * len(self.running)):
            if len(self.running) == 1:
                req = self.running.pop()
                self.finish(req, {"type": "abort", "message": "out of KV memory"})
                return False
            self.retract_one()
        return True

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

    # ---------------------------------------------------------------- sampling and output

    def sample_and_advance(self, reqs: list[Req], logits: torch.Tensor) -> None:
        params = [r.sampling_params for r in reqs]
        info = SamplingBatchInfo.from_params(
            params,
            logits.shape[-1],
            logits.device,
            prompt_token_ids=[r.origin_input_ids for r in reqs],
            output_token_ids=[r.output_ids for r in reqs],
            eos_token_ids=sorted(set().union(*(r.stop_token_ids for r in reqs))),
        )
        want_lp = any(r.return_logprob for r in reqs)
        logits = logits.float().clone()
        apply_grammar_masks(self.grammar, reqs, logits)  # forbidden tokens -> -inf
        out = self.sampler.sample(
            logits,
            info,
            steps=[len(r.output_ids) for r in reqs],
            return_logprob=want_lp,
            top_logprobs_nums=[r.top_logprobs_num if r.return_logprob else 0 for r in reqs]
            if want_lp
            else None,
        ).to_host()
        for i, req in enumerate(reqs):
            tok = out.next_token_ids[i]
            req.output_ids.append(tok)
            req.new_tokens.append(tok)
            if req.return_logprob:
                req.new_logprobs.append((out.next_token_logprobs[i], tok))
                if req.top_logprobs_num > 0:
                    vals = out.top_logprobs_vals[i][: req.top_logprobs_num]
                    ids = out.top_logprobs_ids[i][: req.top_logprobs_num]
                    req.new_top_logprobs.append(list(zip(vals, ids)))
            req.check_finished(self.tokenizer)
            after_token(req, tok)
            if req.finished:
                self.finish(req, req.finished_reason)
            else:
                self.outbox.append(req)

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
