"""Fault isolation for the scheduler (mixed into Scheduler): one bad request never hurts another.

A request that cannot be served is finished with an error carrying an HTTP status (the tokenizer
manager turns it into a 4xx/5xx, or an SSE error event): refused at arrival when its input is one
the scheduler cannot run, or failed with the step it was in when that step raised. Every slot it
held, including those allocated for a forward that never completed, goes back to the pools.
"""

from __future__ import annotations

import logging

from sgl_inkling.constrained.scheduler_hooks import on_new_request
from sgl_inkling.managers import io_struct as io
from sgl_inkling.managers.io_struct import MODEL_STEP_FAULT
from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.model_executor.step_faults import ModelStepError
from sgl_inkling.multimodal.items import MediaItem
from sgl_inkling.sampling.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

def error_reason(message: str, status: int, fault: str | None = None) -> dict:
    reason = {"type": "abort", "message": message, "status_code": status}
    if fault is not None:
        reason["fault"] = fault
    return reason


class FaultIsolationMixin:
    """Needs the Scheduler's kv, grammar, vocab, waiting/running/partial, outbox, step_reqs
    (the requests of the step in progress) and step_allocs (slots allocated past their kv_len)."""

    def add_request(self, msg: io.TokenizedGenerateReq) -> None:
        try:
            req = Req.from_tokenized(msg)
        except Exception as e:  # a malformed message still gets its answer
            logger.exception("could not build request %s", getattr(msg, "rid", "?"))
            req = Req(rid=str(getattr(msg, "rid", "")), origin_input_ids=[], sampling_params=SamplingParams(),
                      stop_token_ids=set())  # fmt: skip
            self.fail_request(req, f"internal error: {type(e).__name__}: {e}", 500)
            return
        problem = self.refusal(req, msg)
        if problem is not None:
            self.fail_request(req, problem, 400)
            return
        try:
            on_new_request(self.grammar, req, msg)  # compiles while the prompt prefills
        except Exception as e:
            logger.exception("request %s failed on arrival", req.rid)
            self.fail_request(req, f"internal error: {type(e).__name__}: {e}", 500)
            return
        self.kv.on_arrival(req)
        self.waiting.append(req)

    def refusal(self, req: Req, msg: io.TokenizedGenerateReq) -> str | None:
        """Why this request cannot run here (checked again though the HTTP edge validates: a request
        that fails inside a batch would take the batch with it)."""
        sp = req.sampling_params
        if not isinstance(sp, SamplingParams):
            return "sampling_params did not arrive as SamplingParams"
        try:
            bias = sp.logit_bias_ids
        except (TypeError, ValueError):
            return "logit_bias keys must be token ids"
        bad = [t for t in bias if not 0 <= t < self.vocab]
        if bad:
            return f"logit_bias token id {bad[0]} is outside the vocabulary [0, {self.vocab})"
        if msg.grammar is not None and sp.min_new_tokens:
            # The grammar may end the output before min_new_tokens; holding the end back would force
            # tokens the grammar forbids.
            return "min_new_tokens cannot be combined with constrained output (json_schema, regex, ebnf, tools)"
        ids = req.origin_input_ids
        if not ids or any(not isinstance(t, int) or not 0 <= t < self.vocab for t in ids):
            return f"input_ids must be a non-empty list of token ids in [0, {self.vocab})"
        if req.mm_items is not None and not all(isinstance(m, MediaItem) for m in req.mm_items):
            return "mm_items is internal: media goes in image_data / audio_data"
        return None

    def fail_request(self, req: Req, message: str, status: int, fault: str | None = None) -> None:
        """Finish the request with an error wherever it is, never caching its (suspect) state."""
        for queue in (self.running, self.partial):
            if req in queue:
                queue.remove(req)
        try:
            self.waiting.remove(req)
        except ValueError:
            pass
        uncommitted = self.step_allocs.pop(req, 0)
        if req.row is not None:
            req.kv_len += uncommitted  # slots allocated for the failed forward: free() returns them
            self.kv.free(req)
        req.finished_reason = error_reason(message, status, fault)
        self.num_finished += 1
        self.outbox.append(req)

    def fail_step(self, e: Exception) -> None:
        """The step raised: fail the requests it was running; everyone else carries on."""
        fault = MODEL_STEP_FAULT if isinstance(e, ModelStepError) else None
        reqs = list(dict.fromkeys(self.step_reqs)) or self.running + self.partial  # unknown: all in flight
        reqs = [r for r in reqs if not (r.finished and r.row is None)]  # finished and freed already
        logger.error(
            "scheduler step failed (%s); failing %d request(s): %s", type(e).__name__, len(reqs),
            [r.rid for r in reqs], exc_info=e,
        )  # fmt: skip
        message = str(e) if fault else f"internal error: {type(e).__name__}: {e}"
        for req in reqs:
            self.fail_request(req, message, 500, fault)
        self.step_reqs, self.step_allocs = [], {}
