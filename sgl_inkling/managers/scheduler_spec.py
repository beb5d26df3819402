"""The scheduler's decode step with MTP speculative decoding (mixed into Scheduler)."""

from __future__ import annotations

import logging

import torch

from sgl_inkling.constrained.scheduler_hooks import after_token
from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.model_executor.step_faults import model_step
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo

logger = logging.getLogger(__name__)


class SpecDecodeMixin:
    """Needs the Scheduler's runner, kv, spec (MTPWorker), sampler, tokenizer, running, outbox."""

    def start_drafting(self, reqs: list[Req]) -> None:
        """After a request's prompt is in and its first token sampled: hold slots for the first
        verify and let the depths draft."""
        k = self.spec.num_steps
        live = []
        for req in reqs:
            if req.finished:
                continue
            if self.kv.reserve(req, k + 1):
                live.append(req)
            else:
                self.running.remove(req)
                self.finish(req, {"type": "abort", "message": "out of KV memory"})
        if live:
            empty = torch.empty(0, self.runner.model.cfg.hidden_size, device=self.runner.device)
            with model_step():
                self.spec.draft(live, [r.kv_len for r in live], [empty] * len(live), self.spec.k)

    def run_spec_decode(self) -> None:
        if self.spec.k == 0:  # the chooser picked no drafts: a plain decode step
            self.run_plain_mtp_step()
            return
        r = self.spec.num_steps + 1
        # A step commits up to r tokens per request and then holds r new slots for the next one.
        if not self.make_room(r):
            return
        reqs = self.step_reqs = list(self.running)
        starts = [q.kv_len for q in reqs]
        rows = self.kv.rows
        rows_t, ids = self.spec.verify_ids(reqs)
        width = ids.shape[1]  # this step's drafts + 1 (adaptive: at most r)
        fb = ForwardBatch.build(
            ForwardMode.EXTEND,
            ids,
            [q.row for q in reqs],
            starts,
            torch.cat([rows.read("full", q.row, q.kv_len, q.kv_len + width) for q in reqs]).tolist(),
            torch.cat([rows.read("swa", q.row, q.kv_len, q.kv_len + width) for q in reqs]).tolist(),
            self.runner.device,
            logits_counts=[width] * len(reqs),
        )
        fallback = [i for i, q in enumerate(reqs) if _needs_plain_sampling(q)]
        limits = [0 if i in fallback else min(q.draft_limit, q.draft_count) for i, q in enumerate(reqs)]
        # Logprobs come from the logits after the grammar masks, as on the plain decode path.
        with model_step():
            out, logits, acc = self.spec.verify(fb, ids, reqs, limits)
            cands = acc.to_host()  # the step's one read from the device
        self.spec.observe([len(c) - 1 for c in cands], limits)
        if fallback:
            toks = self._sample_rows([reqs[i] for i in fallback], logits[fallback, 0])
            for i, tok in zip(fallback, toks):
                cands[i] = [tok]

        kept = []
        for i, req in enumerate(reqs):
            n = 0
            for tok in cands[i]:
                self._append_token(req, tok, logits[i, n] if req.return_logprob else None)
                n += 1
                if req.finished:
                    break
            kept.append(n)
            req.kv_len += n
            req.kv_reserved -= n
            req.spec_verify_ct += 1
            req.spec_accepted_drafts += n - 1
            self.spec.num_verify_steps += 1
            self.spec.num_verify_tokens += n
            if not req.finished and not self.kv.reserve(req, r):  # ensured above: cannot happen
                raise RuntimeError("KV slots for the next verify vanished after ensure()")
        with model_step():
            self.spec.commit(reqs, rows_t, starts, kept, ids, out.hidden)
        for req in reqs:
            self.kv.release_window(req)  # after drafting: the depths re-read the window from `starts`
            if req.finished:
                self.finish(req, req.finished_reason)
            else:
                self.outbox.append(req)
        self.running = [q for q in self.running if not q.finished]

    def run_plain_mtp_step(self) -> None:
        """The plain decode step (the decode graph of the bucket): no drafts, no verify. The depths
        lag and catch up later (speculative/lagging.py): here, for requests whose lag buffer is
        full, for all of them when the chooser then picks k > 0 (drafting k from the pending token),
        and in finish for a request leaving (Scheduler.finish calls settle_depths)."""
        spec, r = self.spec, self.spec.num_steps + 1
        self.step_reqs = list(self.running)
        due = [q for q in self.running if q.depth_lag >= spec.lag_capacity]
        n = len(self.running)
        if not self.kv.ensure(n, n):  # make_room will retract, and the radix tree caches what it retracts
            due = [q for q in self.running if q.depth_lag]
        self._catch_up(due, 0)
        if not self.make_room(1):  # each request's token goes to its first reserved slot; one more is held after
            return
        reqs = self.step_reqs = list(self.running)
        rows = self.kv.rows
        fb = ForwardBatch.build(
            ForwardMode.DECODE,
            [[q.fill_ids[q.kv_len]] for q in reqs],
            [q.row for q in reqs],
            [q.kv_len for q in reqs],
            torch.cat([rows.read("full", q.row, q.kv_len, q.kv_len + 1) for q in reqs]).tolist(),
            torch.cat([rows.read("swa", q.row, q.kv_len, q.kv_len + 1) for q in reqs]).tolist(),
            self.runner.device,
        )
        with model_step():
            out = self.runner.forward(fb)
            spec.record_plain(reqs, fb.input_ids, out.hidden)
        for q in reqs:
            q.kv_len += 1
            q.kv_reserved -= 1
        self.sample_and_advance(reqs, out.logits)  # the plain sampler: grammar masks, penalties, logprobs
        live = [q for q in reqs if not q.finished]
        for q in live:
            if not self.kv.reserve(q, r):  # ensured above: cannot happen
                raise RuntimeError("the KV slot for the next step vanished after ensure()")
        k = spec.choose(len(live))
        self._catch_up(live if k else [], k)
        self.running = [q for q in self.running if not q.finished]

    def _catch_up(self, reqs: list[Req], k: int) -> None:
        with model_step():
            self.spec.catch_up(reqs, k)
        for q in reqs:
            self.kv.release_window(q)  # held while the depths lagged: they read the lagged tokens' window

    def settle_depths(self, req: Req) -> None:
        """Before the radix tree caches a leaving request's state: a checkpoint covers every level,
        so depths still behind (plain decode steps, or past the last step's drafting ones) consume
        the lagged tokens first."""
        if self.spec is None or not req.depth_lag or req.row is None:
            return
        if self.kv.radix is None:  # nothing is cached: the lag dies with the request
            req.depth_lag = req.lag_from = 0
            return
        with model_step():
            self.spec.catch_up([req], 0)

    def _append_token(self, req: Req, tok: int, raw_row: torch.Tensor | None) -> None:
        req.output_ids.append(tok)
        req.new_tokens.append(tok)
        self.num_generated_tokens += 1
        if req.return_logprob and raw_row is not None:
            # As the plain sampler: the float32 minimum stands in for -inf (masked tokens), JSON has no -inf.
            floor = torch.finfo(torch.float32).min
            lp = torch.log_softmax(raw_row.float(), dim=-1)
            req.new_logprobs.append((max(float(lp[tok]), floor), tok))
            if req.top_logprobs_num > 0:
                vals, ids = lp.topk(req.top_logprobs_num)
                req.new_top_logprobs.append(list(zip(vals.clamp_min(floor).tolist(), ids.tolist())))
        req.check_finished(self.tokenizer)
        after_token(req, tok)

    def _sample_rows(self, reqs: list[Req], logits: torch.Tensor) -> list[int]:
        """Requests whose sampling depends on their own history (penalties, seeds) take the trunk's
        first row through the plain sampler and accept no drafts."""
        info = SamplingBatchInfo.from_params(
            [q.sampling_params for q in reqs],
            logits.shape[-1],
            logits.device,
            prompt_token_ids=[q.origin_input_ids for q in reqs],
            output_token_ids=[q.output_ids for q in reqs],
            eos_token_ids=sorted(set().union(*(q.stop_token_ids for q in reqs))),
        )
        out = self.sampler.sample(logits.clone(), info, steps=[len(q.output_ids) for q in reqs]).to_host()
        return list(out.next_token_ids)


def _needs_plain_sampling(req: Req) -> bool:
    p = req.sampling_params
    return p.needs_penalties or (p.seed is not None and not p.is_greedy)
