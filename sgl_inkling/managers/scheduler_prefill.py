"""The scheduler's prefill step (mixed into Scheduler): chunked prefill under a per-step token budget
and, with --enable-mixed-chunk, one decode token for every running request in the same EXTEND forward.

Admission order. Requests already partly prefilled go first (they hold memory), then the waiting
queue in the policy's order (schedule_policy.py: arrival order, except that lpm may reorder a long
queue among requests that have waited less than MAX_WAIT_S). Admission is head-of-line: when the
request at the head does not fit (no table row, or not enough KV memory), nobody behind it is
admitted, so a long prompt is never overtaken by a stream of short ones; it waits only for the
chunks ahead of it and for memory that running requests give back. A partially prefilled request
holds memory, so its next chunk shrinks to what is left (down to MIN_CHUNK_TOKENS) rather than
waiting for a whole chunk; a new request waits for a whole first chunk.

Mixed steps. A decode is an extend of one token on the request's cached prefix, so a step that
prefills a chunk also carries the next token of every running request: running requests keep
decoding while new prompts prefill, instead of pausing for every chunk. Those decode tokens count
against the budget (--chunked-prefill-size): the chunk gets what the running batch leaves. The step
does not mix (it prefills alone with the whole budget, as without the flag) when the running batch
would take more than half of the budget, or when there is no memory for its decode tokens (the
plain decode step then retracts): waiting prompts are never starved by decode. When a mixed
forward raises, the riders' conv state (saved before it) and slots are put back: only the prefill
requests fail, as they would without mixing, and the riders decode again the next step.

With overlap scheduling (the default) a mixed step is overlapped like a decode step: the riders'
tokens come from the pending step on the device, the forward is queued before the pending step is
committed, and the step's own sampling becomes the next pending step (scheduler_overlap.py). So is a
step without riders (a wave's first prompt, or any prefill without the flag) when it is long (half the
budget or more) or requests wait behind it: its first tokens are read at the next step's commit, and
the host builds that step while the device runs this one (a synchronous first prefill of 8K tokens
left the GPU idle ~70 ms on the H200 while the host read its token back, took in the rest of the
wave's requests and built the next 8K-token step). A short one with nothing behind it reads its
tokens back at once: there is little to hide, and its first token is what its client waits for.
"""

from __future__ import annotations

import time

import torch

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.managers.scheduler_log import log_prefill
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.model_executor.step_faults import model_step
from sgl_inkling.multimodal.embed import extend_input_embeds
from sgl_inkling.sampling.host_copy import to_device

# A partial prefill's chunk shrunk to the memory left is never shorter than this (unless the
# prompt's rest is): a step for fewer tokens adds a cached node and its checkpoint for little
# progress, while waiting costs at most the few steps in which decode uses the rest up and retracts.
MIN_CHUNK_TOKENS = 16

Entry = tuple[Req, int, tuple]  # request, new tokens this step, their (full, swa) KV slots


def logit_rows(req: Req, n: int) -> int:
    """Logit rows a prefill chunk of n tokens at req.kv_len needs: its last (sampled from when the
    chunk ends the prompt) and, for prompt logprobs, each row predicting a token at or after
    logprob_start_len (row j predicts token kv_len + j + 1). Rows before that are never computed:
    a [chunk x vocabulary] float32 block per request is 6.6 GB at 8K tokens on Inkling."""
    if not req.wants_input_logprobs:
        return 1
    return max(1, n - max(0, req.logprob_start_len - 1 - req.kv_len))


class PrefillMixin:
    """Needs the Scheduler's kv, runner, spec, policy, chunk_budget, mixed_chunk, waiting/running/
    partial, step_reqs/step_allocs, mixed_counts, finish and sample_and_advance, and the overlap
    mixin's overlap, decode_steps, _input_ids, commit_pending and launch_mixed."""

    def run_prefill(self) -> bool:
        """Continue partially prefilled requests, then admit waiting ones, within the token and memory
        budget; running requests ride along when the step mixes. False when no prefill could run."""
        decode = self._riders()
        budget = self.chunk_budget - len(decode)
        batch: list[Entry] = []
        new_seqs: list[Req] = []  # admitted in this step (their first chunk)
        # Keep one decode step's slots per running request free so admission never forces a retraction
        # (plus this step's decode tokens when they ride along).
        per_req = self.spec.num_steps + 1 if self.spec is not None else 1
        reserve = per_req * len(self.running) + len(decode)
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
            want = min(len(req.fill_ids) - req.kv_len, budget)
            # A partial request holds memory already: its chunk shrinks to what is left. A new one
            # waits for a whole first chunk: squeezed into the last slots it would take those the
            # next decode step needs, and be put back to wait (make_room's retract_partial) or
            # cost a running request its retraction, for a few tokens of progress.
            n = self._chunk_that_fits(want, want if fresh else min(want, MIN_CHUNK_TOKENS), reserve)
            locs = self.kv.alloc(req, n) if n else None
            if locs is None:
                if fresh:
                    self.kv.free(req)  # give back the row and the prefix lock; it stays waiting
                break
            self._remove_waiting(req)
            self.step_allocs[req] = n
            if req.queue_time is None:
                req.queue_time = time.monotonic() - req.arrival
            batch.append((req, n, locs))
            if fresh:
                new_seqs.append(req)
            budget -= n
            reserve += per_req
            if n < want:
                break  # shrunk to the memory left: nothing behind it fits
        if not batch:
            self.step_reqs = []
            return False
        full, swa = self.kv.alloc_each(decode) if decode else (None, None)  # reserved above: cannot fail
        riders = [(r, 1, (full[i : i + 1], swa[i : i + 1])) for i, r in enumerate(decode)]
        self.step_allocs.update(dict.fromkeys(decode, 1))
        self.step_reqs = [r for r, _, _ in batch] + decode
        scheduled = {id(r) for r, _, _ in batch}
        self.partial = [r for r in self.partial if id(r) not in scheduled]  # forward_extend re-adds
        log_prefill(self, batch, new_seqs, riders)
        self.forward_extend(batch, riders)
        return True

    def _riders(self) -> list[Req]:
        """The running requests whose next token rides on this step's prefill (none when not mixing)."""
        n = len(self.running)
        if not self.mixed_chunk or n == 0 or 2 * n > self.chunk_budget:
            return []
        return list(self.running) if self.kv.ensure(n, n) else []

    def _chunk_that_fits(self, want: int, least: int, reserve: int) -> int:
        """The longest chunk of at most `want` tokens, and at least `least`, whose KV (full and
        sliding) fits beside `reserve`, evicting from the radix cache as needed; 0 when none fits.
        Waiting for a whole chunk instead could stall a partial prefill, holding its memory, until
        decode ran dry and retracted (tens of steps)."""
        if self.kv.ensure(want + reserve, want + reserve):
            return want
        # ensure() evicted all it could: what is free now is all there is (SGLang shrinks the chunk
        # to it likewise, in page units: ours are tokens).
        room = min(self.kv.full.available, self.kv.swa.available) - reserve
        return min(want, room) if room >= least else 0

    def _fits_at_all(self, req: Req) -> bool:
        return len(req.fill_ids) + 1 <= self.kv.full.num_slots

    def _remove_waiting(self, req: Req) -> None:
        try:
            self.waiting.remove(req)
        except ValueError:
            pass

    def forward_extend(self, batch: list[Entry], riders: list[Entry] = ()) -> None:
        """One EXTEND forward over the prefill chunks and then the riders' decode tokens; overlapped
        (the module docstring) with overlap scheduling."""
        long = 2 * sum(n for _, n, _ in batch) >= self.chunk_budget
        overlapped = self.overlap and (bool(riders) or long or bool(self.waiting))
        decoders = [r for r, _, _ in riders]
        entries = list(batch) + list(riders)
        rider_ids = self._input_ids(decoders) if decoders else []  # a pending step's: on the device
        on_device = isinstance(rider_ids, torch.Tensor)
        tokens = [req.fill_ids[req.kv_len : req.kv_len + n] for req, n, _ in batch]
        tokens += [[0]] * len(decoders) if on_device else rider_ids  # placeholders, overwritten below
        counts = [logit_rows(req, n) for req, n, _ in batch] + [1] * len(decoders)
        fb = ForwardBatch.build(
            ForwardMode.EXTEND,
            tokens,
            [r.row for r, _, _ in entries],
            [r.kv_len for r, _, _ in entries],
            torch.cat([loc[0] for _, _, loc in entries]).tolist(),
            torch.cat([loc[1] for _, _, loc in entries]).tolist(),
            self.runner.device,
            logits_counts=counts,
        )
        if on_device:  # the riders' tokens are the batch's last ones: one device copy, no host sync
            fb.input_ids[fb.input_ids.numel() - len(decoders) :] = rider_ids.view(-1)
        if self.kv.radix is not None:  # checkpoints inside prefill chunks only (a rider's one token has none)
            fb.sconv_snapshots = {i: self.kv.snapshot_plan(r, n) for i, (r, n, _) in enumerate(batch)}
            fb.sconv_checkpoints = self.kv.radix.ckpts
        saved = self._save_conv_state(riders)
        try:
            fb.input_embeds = extend_input_embeds(self.runner.model, [(r, r.kv_len, n) for r, n, _ in entries], fb.input_ids)
            out = self.runner.forward(fb)
        except Exception:
            self._unload_riders(riders, saved)  # the step fails its prefill requests only
            raise
        logits = out.logits
        if self.spec is not None:  # riders never come with MTP (server_args refuses the mix)
            starts = torch.cumsum(torch.tensor([0] + [n for _, n, _ in batch]), 0).tolist()
            with model_step():
                self.spec.after_extend(
                    [(r, n, out.hidden[starts[i] : starts[i] + n], fb.sconv_snapshots.get(i, []))
                     for i, (r, n, _) in enumerate(batch)],
                    self.kv.radix.ckpts if self.kv.radix is not None else None,
                )  # fmt: skip
        for req in decoders:  # as a decode step: the token is in, the window slides, nothing is cached
            req.kv_len += 1
            self.step_allocs.pop(req, None)
        self.kv.release_windows(decoders)
        if decoders:
            self.mixed_counts["num_mixed_steps"] += 1
            self.mixed_counts["num_mixed_decode_tokens"] += len(decoders)
        if overlapped:
            self.decode_steps["overlap_mixed_steps" if decoders else "overlap_prefill_steps"] += 1
            self.commit_pending()  # step n's tokens, read while the device runs this step
        done, rows, prompt_lps, offset = [], [], [], 0
        for (req, n, _), k in zip(batch, counts):
            if req.wants_input_logprobs:  # read after the sampling is queued: reading waits for the forward
                prompt_lps.append((req, logits[offset : offset + k], n, req.kv_len))
            offset += k
            req.kv_len += n
            self.step_allocs.pop(req, None)
            self.kv.after_extend(req)
            if req.kv_len == len(req.fill_ids) and req.sampling_params.max_new_tokens == 0:
                self.finish(req, {"type": "length", "length": 0})  # prompt logprobs only (e.g. select)
            elif req.kv_len == len(req.fill_ids):
                done.append(req)
                rows.append(offset - 1)
            else:
                self.partial.append(req)
        # A rider that finished at the committed step consumed its token here but samples nothing.
        live = [(offset + i, r) for i, r in enumerate(decoders) if not r.finished]
        sampled = [r for _, r in live] + done
        if sampled:
            logits = logits.index_select(0, to_device([i for i, _ in live] + rows, torch.int64, logits.device))
        if overlapped:
            self.launch_mixed(sampled, logits, done)
        elif sampled:
            self.sample_and_advance(sampled, logits)
            self.running = [r for r in self.running if not r.finished]
            self.running.extend(r for r in done if not r.finished)
            if self.spec is not None:
                self.start_drafting([r for r in done if not r.finished])
        for job in prompt_lps:
            self._collect_input_logprobs(*job)

    def _save_conv_state(self, riders: list[Entry]) -> list[torch.Tensor] | None:
        """The riders' conv windows before the forward moves them (a few KB per request, one gather for
        every layer's streams), so that a failed mixed step can put them back."""
        if not riders:
            return None
        rows = to_device([r.row for r, _, _ in riders], torch.int64, self.runner.device)  # no host sync
        return [rows] + self.runner.sconv_pool.copy_rows(rows)

    def _unload_riders(self, riders: list[Entry], saved: list[torch.Tensor] | None) -> None:
        """A mixed forward raised: the riders get their conv state and slots back and stay running, so
        only the prefill requests fail (fail_step fails step_reqs); they decode again next step."""
        if not riders:
            return
        rows, *states = saved
        self.runner.sconv_pool.put_rows(rows, states)
        for req, _, (full, swa) in riders:
            self.kv.full.free(full)
            self.kv.swa.free(swa)
            self.step_allocs.pop(req, None)
        decoders = {id(r) for r, _, _ in riders}
        self.step_reqs = [r for r in self.step_reqs if id(r) not in decoders]

    def _collect_input_logprobs(self, req: Req, rows: torch.Tensor, n: int, at: int) -> None:
        """Logprob of each prompt token from logprob_start_len, from the logits one position earlier
        (rows: those of the chunk of n tokens that started at position `at`)."""
        acc = req.input_lp_partial
        prompt = req.origin_input_ids
        start = req.logprob_start_len
        if at <= start < at + n and start == 0:
            acc.append((None, prompt[0]))
        lp = torch.log_softmax(rows.float(), dim=-1)
        skip = n - rows.shape[0]  # the chunk's rows before these predict tokens before `start`
        for j in range(skip, n):
            pos = at + j  # logits at pos predict token pos + 1
            nxt = pos + 1
            if start <= nxt < len(prompt):
                acc.append((float(lp[j - skip, prompt[nxt]]), prompt[nxt]))
        if at + n >= len(prompt):
            req.input_logprobs = acc
