"""Sampling a step's tokens and committing them to their requests (mixed into Scheduler).

The two halves are apart so that overlap scheduling can launch a step's sampling on the device and
commit its tokens a step later (scheduler_overlap.py); the synchronous path does one after the other.
"""

from __future__ import annotations

import torch

from sgl_inkling.constrained.scheduler_hooks import after_token, apply_grammar_masks
from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.sampling.sampler import HostSampleOutput, SampleOutput
from sgl_inkling.sampling.sampling_batch_info import SamplingBatchInfo


class SamplingMixin:
    """Needs the Scheduler's sampler, grammar, tokenizer, outbox and finish()."""

    def sample_and_advance(self, reqs: list[Req], logits: torch.Tensor) -> None:
        self.commit_tokens(reqs, self.launch_sampling(reqs, logits).to_host())

    def launch_sampling(self, reqs: list[Req], logits: torch.Tensor) -> SampleOutput:
        """Queue the sampling of one token per request (row i of logits is request i's); nothing is
        read back. Penalties, seeds and grammar masks come from each request's committed history."""
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
        # The sampler and the grammar masks work in place on a float copy. A greedy batch with no
        # penalties, grammars or logprobs only takes an argmax: it reads the forward's logits as they
        # are, sparing a [batch, vocabulary] float copy every decode step.
        argmax_only = (
            info.is_all_greedy and info.penalties is None and not want_lp
            and all(getattr(r, "grammar", None) is None for r in reqs)
        )  # fmt: skip
        logits = logits.float() if argmax_only else logits.float().clone()
        apply_grammar_masks(self.grammar, reqs, logits)  # forbidden tokens -> -inf
        return self.sampler.sample(
            logits,
            info,
            steps=[len(r.output_ids) for r in reqs],
            return_logprob=want_lp,
            top_logprobs_nums=[r.top_logprobs_num if r.return_logprob else 0 for r in reqs]
            if want_lp
            else None,
        )

    def commit_tokens(self, reqs: list[Req], out: HostSampleOutput) -> None:
        """Append each request's token (and logprobs), check its stop conditions, advance its grammar;
        finish it or queue its output. A request finished meanwhile (aborted while its token was in
        flight) takes nothing."""
        for i, req in enumerate(reqs):
            if req.finished:
                continue
            tok = out.next_token_ids[i]
            req.output_ids.append(tok)
            req.new_tokens.append(tok)
            self.num_generated_tokens += 1
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
