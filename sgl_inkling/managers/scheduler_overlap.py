"""Plain (non-MTP) decode steps and mixed prefill + decode steps, overlapped as SGLang's overlap
scheduler does, or synchronous (mixed into Scheduler).

An overlapped decode step n + 1, with step n's sampling still in flight (`self.pending`):
1. build and launch step n + 1's forward. Its input ids are step n's sampled-token tensor, which
   never leaves the device (a request that joined since brings its last token from the host);
2. wait for step n's tokens (copied to pinned memory behind an event queued with step n's
   sampling, so the wait ends while the device runs step n + 1) and commit them: output lists, stop
   ids, lengths and stop strings, grammar matchers, finishing, the outbox;
3. queue step n + 1's sampling for the requests still live. Penalties, seeds and grammar masks are
   built here from the committed history, so they are exactly the synchronous path's; a grammar's
   mask is filled on the host while the forward runs (into the masker's reused pinned buffer: safe,
   since the commit waited for an event queued after the previous mask's copy).
The outbox of step n then goes to the detokenizer while the device still works on step n + 1.

A request that finished at step n (a stop token, its length, a stop string, its grammar) has run
step n + 1's forward too: that forward consumed its last token, so its KV and short-conv state are
those of its whole output (the prefix cache takes them, as a continuation would want); it samples
nothing and its slots are freed with it. A request aborted while its token is in flight discards it.

A mixed step (--enable-mixed-chunk: prefill chunks with one decode token per running request, see
scheduler_prefill.py) runs the same three phases: its EXTEND batch is built on the host with a
placeholder at each rider's position, which one device copy then overwrites with the pending step's
token (the `_input_ids` gather); the forward is queued, the pending step committed, and the sampling
of the riders still live plus the requests whose prompt completed in this chunk becomes the new
pending step. Those requests join the running batch at once and their first token is read at the
next commit, so their TTFT includes one more step than the synchronous path's. Prompt logprobs are
read from the logits after the sampling is queued (the read waits for the forward: correct, only
less overlapped). When the forward raises, nothing was committed: the riders are put back and the
pending step stays pending.

A prefill step without riders (no running requests, or --no-enable-mixed-chunk) runs the same way
with no rider tokens when it is long or requests wait behind it (scheduler_prefill.py): its forward
is queued, the pending step (if any) committed, and the sampling of the requests whose prompt
completed becomes the new pending step.

Synchronous instead (the pending step committed first): steps that need every token on the host,
i.e. a short prefill step without riders and nothing waiting (its first token at once: the TTFT),
a decode step that must retract (the victim's tokens must be known), MTP (verify reads its
acceptance back: overlap is off, logged at start), --disable-overlap-schedule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.sampling.host_copy import to_device
from sgl_inkling.sampling.sampler import HostSampleOutput

logger = logging.getLogger(__name__)


@dataclass
class PendingStep:
    """A decode or mixed step whose sampling is queued but whose tokens the host has not read yet."""

    reqs: list[Req]  # row i of next_ids is reqs[i]'s token
    next_ids: torch.Tensor  # [B] int64, on the device: the next step's input ids
    result: Callable[[], HostSampleOutput]  # waits for the host copies


class OverlapDecodeMixin:
    """Needs the Scheduler's runner, kv, spec, running, step_reqs / step_allocs, make_room() and the
    SamplingMixin's launch_sampling / commit_tokens / sample_and_advance."""

    def init_overlap(self, server_args) -> None:
        wanted = not server_args.disable_overlap_schedule
        self.overlap = wanted and server_args.speculative_algorithm is None
        if wanted and not self.overlap:
            logger.info("overlap scheduling is off: MTP verify steps run synchronously")
        elif self.overlap:
            mixed = " and mixed prefill + decode steps" if server_args.enable_mixed_chunk else ""
            logger.info("overlap scheduling is on: decode steps%s overlap", mixed)
        self.pending: PendingStep | None = None
        self.decode_steps = {"overlap_decode_steps": 0, "sync_decode_steps": 0, "overlap_mixed_steps": 0,
                             "overlap_prefill_steps": 0}

    def overlap_stats(self) -> dict:
        return {"overlap_schedule": self.overlap, **self.decode_steps}

    def run_decode(self) -> None:
        if self.spec is not None:
            self.run_spec_decode()
            return
        n = len(self.running)
        if self.overlap and self.kv.ensure(n, n):
            self.decode_steps["overlap_decode_steps"] += 1
            self._decode_overlapped()
            return
        self.commit_pending()  # retraction picks its victim by progress: every token must be known
        self.decode_steps["sync_decode_steps"] += 1
        if self.running and self.make_room(1):
            reqs, logits = self._decode_forward(lambda rs: [[r.output_ids[-1]] for r in rs])
            self.sample_and_advance(reqs, logits)
            self.running = [r for r in self.running if not r.finished]

    def commit_pending(self) -> None:
        """Read the pending step's tokens and commit them (waits for its sampling if still running)."""
        p, self.pending = self.pending, None
        if p is None:
            return
        self.step_reqs = [*self.step_reqs, *p.reqs]  # should committing fail, these fail with the step
        self.commit_tokens(p.reqs, p.result())
        self.running = [r for r in self.running if not r.finished]

    def _decode_overlapped(self) -> None:
        reqs, logits = self._decode_forward(self._input_ids)  # queued: the device starts step n + 1
        self.commit_pending()  # step n's tokens, read while the device runs step n + 1
        live = [i for i, r in enumerate(reqs) if not r.finished]
        if live:
            if len(live) < len(reqs):  # finished at step n: their extra step samples nothing
                logits = logits.index_select(0, to_device(live, torch.int64, logits.device))
            live_reqs = [reqs[i] for i in live]
            out = self.launch_sampling(live_reqs, logits)
            self.pending = PendingStep(live_reqs, out.next_token_ids, out.to_host_later())
        self.running = [r for r in self.running if not r.finished]

    def launch_mixed(self, reqs: list[Req], logits: torch.Tensor, done: list[Req]) -> None:
        """A mixed step's forward is queued and the previous step committed: queue its sampling (row i
        of logits is reqs[i]'s) as the new pending step. The requests whose prompt completed (`done`)
        join the running batch now; their first token is read at the next commit."""
        if reqs:
            out = self.launch_sampling(reqs, logits)
            self.pending = PendingStep(reqs, out.next_token_ids, out.to_host_later())
        self.running = [r for r in self.running if not r.finished] + done

    def _input_ids(self, reqs: list[Req]) -> torch.Tensor | list[list[int]]:
        """The step's input ids: a pending request's from the device, the others' from the host."""
        p = self.pending
        if p is None:
            return [[r.output_ids[-1]] for r in reqs]
        if reqs == p.reqs:  # the usual step: the same requests in the same order
            return p.next_ids.view(-1, 1)
        row = {r: i for i, r in enumerate(p.reqs)}
        known = [r for r in reqs if r not in row]  # joined after a prefill: their last token is on the host
        at = {r: len(p.reqs) + j for j, r in enumerate(known)}
        index = [row[r] if r in row else at[r] for r in reqs]
        dev = p.next_ids.device
        table = torch.cat([p.next_ids, to_device([r.output_ids[-1] for r in known], torch.int64, dev)])
        return table.index_select(0, to_device(index, torch.int64, dev)).view(-1, 1)

    def _decode_forward(self, input_ids: Callable[[list[Req]], torch.Tensor | list[list[int]]]):
        """Allocate one KV slot per running request and run (on a GPU: queue) the decode forward."""
        reqs = self.step_reqs = list(self.running)
        full, swa = self.kv.alloc_each(reqs)  # the callers made room for one token each
        self.step_allocs = dict.fromkeys(reqs, 1)
        fb = self.runner.decode_batch(input_ids(reqs), [r.row for r in reqs], [r.kv_len for r in reqs],
                                      full.tolist(), swa.tolist())  # fmt: skip
        logits = self.runner.forward(fb).logits
        self.step_allocs = {}
        for r in reqs:
            r.kv_len += 1
        self.kv.release_windows(reqs)
        return reqs, logits
