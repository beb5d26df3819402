"""MTP speculative decoding: the depths draft a chain of tokens, the trunk verifies it in one forward.

A step for a running request with committed length q (every level has consumed tokens [0, q)),
pending token x_q and drafts d_1..d_K:
1. verify: the trunk consumes [x_q, d_1..d_K] (positions q..q+K); its conv windows are captured;
2. accept (acceptance.py): a drafts and one trunk token, truncated where the request finishes;
   the trunk's conv state is restored to just after the n consumed tokens that were kept, and the
   KV of rejected drafts stays in slots the request owns (overwritten later);
3. draft: every depth consumes the newly committed tokens, then speculatively the new pending
   token and the drafts of the depths before it; depth d's logits give draft d + 1. DraftStep
   (draft_step.py) does it at fixed shapes, replayed from CUDA graphs when they are on; DepthChain
   (levels.py) does it for prompts and the other ragged cases; a grammar-constrained request's
   drafts are kept to their grammar on both (grammar_drafts.py).
Each depth is restored to its commit point afterwards, so after every step the trunk and all
depths hold exactly the state of the accepted tokens. Drafts stay on the device (`draft_buf`, per
request row) until the next verify reads them; a step reads back only the acceptance decisions.
A step for which the adaptive chooser picks no drafts is a plain decode step instead (lagging.py).
"""

from __future__ import annotations

import logging

import torch

from sgl_inkling.managers.schedule_batch import Req
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.sampling.host_copy import to_device
from sgl_inkling.speculative.acceptance import greedy_accept, sample_accept
from sgl_inkling.speculative.adaptive import StepCosts
from sgl_inkling.speculative.conv_windows import ConvWindows
from sgl_inkling.speculative.draft_control import DraftControl
from sgl_inkling.speculative.draft_step import DraftStep
from sgl_inkling.speculative.grammar_drafts import GrammarDrafts
from sgl_inkling.speculative.lagging import LaggingDepths
from sgl_inkling.speculative.levels import DepthChain, LevelSeq

logger = logging.getLogger(__name__)


class MTPWorker(DraftControl, GrammarDrafts, LaggingDepths):
    def __init__(
        self,
        runner: ModelRunner,
        num_steps: int | None,
        grammar_backend=None,
        adaptive: bool = False,
        token_map: torch.Tensor | None = None,  # draft vocabulary (--speculative-token-map)
        capture: bool = True,  # False: the caller allocates its pools first, then calls capture_graphs
    ):
        model = runner.model
        depths = model.num_mtp_layers
        if depths == 0:
            raise ValueError("--speculative-algorithm MTP: this checkpoint has no MTP layers (model.mtp.*)")
        num_steps = depths if num_steps is None else num_steps
        if not 1 <= num_steps <= depths:
            raise ValueError(f"--speculative-num-steps must be in 1..{depths} for this checkpoint, got {num_steps}")
        self.runner = runner
        self.num_steps = num_steps  # the most drafts per step (depths used)
        model.set_draft_vocab(token_map)  # before any graph capture: graphs read the draft head
        self.grammar = grammar_backend
        cfg = model.cfg
        pool = runner.sconv_pool
        self.carry = pool.add_state("mtp_carry", (num_steps, cfg.hidden_size))

        trunk = cfg.num_hidden_layers
        self.trunk_capture = ConvWindows(pool, [list(range(trunk))], num_steps + 1)
        # A depth consumes up to K + 1 committed tokens, the pending one and K - 1 drafts per step.
        depth_capture = ConvWindows(pool, [[trunk + d for d in range(num_steps)]], 2 * num_steps + 1)
        self.chain = DepthChain(runner, num_steps, self.carry, depth_capture)
        self.draft_buf = torch.zeros(pool.size, num_steps, dtype=torch.int64, device=runner.device)
        self._init_lagging(pool.size, cfg.hidden_size)  # k = 0 steps are plain decode steps (lagging.py)
        self.step = DraftStep(runner, num_steps, self.carry, self.trunk_capture, depth_capture, self.draft_buf,
                              self.lag_ids, self.lag_hidden)  # fmt: skip
        self.verify_graphs = self.draft_graphs = None
        # DraftStep pads every request to the longest case: worth it only where it replaces launch
        # overhead (CUDA graphs); the ragged DepthChain does less work everywhere else. Tests set it.
        self.fixed_shapes = False
        # Adaptive: each step drafts the k in 0..K that the measured costs and acceptance favour.
        self._init_draft_control(num_steps, adaptive)
        self.num_verify_steps = 0
        self.num_verify_tokens = 0  # tokens emitted by verify steps (accepted drafts + one each)
        self.num_fixed_shape_steps = 0  # draft steps DraftStep ran (the rest ran DepthChain)
        # Verify steps by where their acceptance was judged: the greedy or sampled rule in the verify
        # graph (eager on its static buffers without CUDA), or outside it (grammar, larger batches...).
        self.judged = {"greedy_graph": 0, "sampled_graph": 0, "outside": 0}
        if capture:
            self.capture_graphs()

    def capture_graphs(self) -> None:
        """Capture the verify and draft graphs (when the runner has CUDA graphs) and, adaptive,
        measure the step costs from them. The scheduler calls this once every pool is allocated
        (the prefix cache's checkpoints hold the depths' carried state, so they come after
        __init__): the graphs are sized from the memory really left (graph_max_bs), not from
        memory a pool is about to take. Kernels compiled here count as warm-up (jit_watch): no
        request is waiting yet. Where the runner warmed its kernels up, the depths' are warmed up
        first (kernel_warmup.warm_up_mtp_kernels): the graphs hold only fixed-shape steps, and
        without graphs nothing else would compile them before a request."""
        from sgl_inkling.model_executor.kernel_warmup import warm_up_mtp_kernels
        from sgl_inkling_kernels.jit_watch import warming_up

        with warming_up():
            if self.runner.kernel_warmup:
                warm_up_mtp_kernels(self.runner, self.num_steps, self.trunk_capture, self.step.depth_capture)
            self._capture_graphs()

    def _capture_graphs(self) -> None:
        runner, num_steps = self.runner, self.num_steps
        # Verify widths (k + 1 tokens per request) that replay from graphs: all of them when adaptive.
        widths = range(num_steps + 1, 0, -1) if self.adaptive else [num_steps + 1]
        if runner.graphs is not None:  # CUDA graphs on: verify and draft steps replay per batch bucket too
            from sgl_inkling.speculative.draft_graphs import DraftGraphRunner
            from sgl_inkling.speculative.verify_graphs import VerifyGraphRunner, graph_max_bs
            from sgl_inkling.speculative.verify_graphs import sampled_graph_max_bs as sampled_max

            free = torch.cuda.mem_get_info(runner.device)[0]
            max_bs = graph_max_bs(runner, widths, free)  # larger batches verify and draft eagerly
            sampled_bs = sampled_max(runner, widths, max_bs, free)  # above: judged outside
            if max_bs == 0:
                logger.warning("MTP: %.1f GiB free after the pools: verify and draft steps run without CUDA graphs "
                               "(lower --mem-fraction-static to leave room for them)", free / 2**30)  # fmt: skip
            else:
                graph_pool = torch.cuda.graph_pool_handle()  # one pool: a step's graphs run one after another
                self.verify_graphs = {r: VerifyGraphRunner(runner, r, self.trunk_capture, max_bs, graph_pool,
                                                           sampled_max_bs=sampled_bs) for r in widths}  # fmt: skip
                self.draft_graphs = DraftGraphRunner(self.step, max_bs, [r - 1 for r in widths], graph_pool,
                                                     masks=self.grammar is not None, tails=self.tail_lag)  # fmt: skip
                self.fixed_shapes = True
        if self.adaptive:
            from sgl_inkling.speculative.step_costs import measure_step_costs

            if self.verify_graphs:
                from sgl_inkling.distributed.sync import broadcast_object

                # Rank 0's timings on every rank: all TP ranks must draft the same k every step.
                self.costs = broadcast_object(measure_step_costs(self))
            else:
                self.costs = StepCosts.given(num_steps)
            self.k = self.choose(1)

    # ---------------------------------------------------------------- prefill

    def after_extend(self, entries: list[tuple[Req, int, torch.Tensor, list[tuple[int, int]]]], ckpts) -> None:
        """The depths consume the prompt chunk the trunk just did: (req, new tokens, trunk hidden of
        those tokens, checkpoint plan as (tokens into the chunk, slot))."""
        seqs = [
            LevelSeq(
                row=req.row,
                start=req.kv_len,
                tokens=req.fill_ids[req.kv_len : req.kv_len + n],
                commit=req.kv_len + n,
                trunk_hidden=hidden,
                snapshots=[(req.kv_len + j, slot) for j, slot in plan],
            )
            for req, n, hidden, plan in entries
        ]
        self.chain.run(seqs, ckpts=ckpts)

    # ---------------------------------------------------------------- draft

    def draft(self, reqs: list[Req], starts: list[int], hidden: list[torch.Tensor], k: int) -> None:
        """Commit the tokens each request's trunk consumed since `starts[i]` (trunk outputs in
        `hidden[i]`) at every depth, and draft the next k tokens for the unfinished requests.

        Unfinished requests need KV slots for tokens [kv_len, kv_len + K] (the next verify)."""
        seqs = []
        for req, start, h in zip(reqs, starts, hidden):
            tokens = req.fill_ids[start : req.kv_len]
            if not req.finished:
                tokens = tokens + [req.fill_ids[req.kv_len]]  # the pending token, consumed speculatively
            seqs.append(LevelSeq(req.row, start, tokens, req.kv_len, h, want_drafts=not req.finished))
        open_grammars = self._start_grammars(reqs, k)
        pick = lambda d, idx, logits: self._pick(reqs, d, idx, logits)  # noqa: E731
        drafts = self.chain.run(seqs, pick_drafts=pick, num_drafts=k)
        live = [i for i, req in enumerate(reqs) if not req.finished]
        if live:
            rows = to_device([reqs[i].row for i in live], torch.int64, self.runner.device)
            if k:
                self.draft_buf[rows, :k] = to_device([drafts[i] for i in live], torch.int64, self.runner.device)
        for req in open_grammars:
            req.grammar.rollback(req.draft_tentative)
            req.draft_tentative = 0

    # ---------------------------------------------------------------- verify

    def verify_ids(self, reqs: list[Req]) -> tuple[torch.Tensor, torch.Tensor]:
        """The requests' rows [B] and, [B, k + 1], each one's pending token then its drafts (device),
        k the most drafts any of them has (a request with fewer accepts at most its own count)."""
        dev = self.runner.device
        k = max(q.draft_count for q in reqs)
        rows = to_device([q.row for q in reqs], torch.int64, dev)
        pending = to_device([q.fill_ids[q.kv_len] for q in reqs], torch.int64, dev)
        return rows, torch.cat([pending[:, None], self.draft_buf[rows, :k]], dim=1)

    def verify(self, batch, ids: torch.Tensor, reqs: list[Req], limits: list[int]):
        """The trunk over [pending token, drafts] of every request (conv windows captured), and
        the acceptance decisions. Returns (trunk output, logits [B, k + 1, V] with grammar masks
        applied, acceptance.Accepted)."""
        b, r, dev = len(reqs), ids.shape[1], self.runner.device
        batch.sconv_capture = self.trunk_capture
        forced = self.forced_counts(b)
        limits_t = to_device(limits, torch.int64, dev)
        forced_t = to_device(forced if forced is not None else [-1] * b, torch.int64, dev)
        acc = sampled = None
        graphs = self.verify_graphs.get(r) if self.verify_graphs is not None else None
        if graphs is not None and graphs.can_run(batch):
            grammar = any(q.grammar is not None for q in reqs)
            sampled = graphs.sampling_inputs([q.sampling_params for q in reqs], grammar or forced is not None)
            out, acc = graphs.replay(batch, limits_t, forced_t, *(sampled or ()))
        else:
            out = self.runner.forward(batch)
        logits = out.logits.view(b, r, -1)
        masked = self.verify_masks(reqs, logits)
        # A sampled graph judged unmasked logits: sampling_inputs excluded batches with a grammar.
        judged = "sampled_graph" if sampled else "greedy_graph"
        if not sampled and forced is None and not all(q.sampling_params.is_greedy for q in reqs):
            acc, judged = sample_accept(logits, ids, [q.sampling_params for q in reqs], limits_t), "outside"
        elif not sampled and (acc is None or masked):
            acc, judged = greedy_accept(logits, ids, limits_t, forced_t), "outside"
        self.judged[judged] += 1
        return out, logits, acc

    # ---------------------------------------------------------------- commit and draft

    def commit(self, reqs: list[Req], rows: torch.Tensor, starts: list[int], kept: list[int], ids: torch.Tensor,
               hidden: torch.Tensor):  # fmt: skip
        """After a verify whose first kept[i] tokens each request keeps (kv_len already moved on):
        roll the trunk back to them, let every depth consume them and draft the next tokens.
        rows and ids are verify_ids' results."""
        b, r, dev = len(reqs), ids.shape[1], self.runner.device
        self.k = self.choose(sum(not q.finished for q in reqs))
        fixed = self._fixed_shape_rows(reqs, starts)
        # The rest (short prompts, batches past the graphs' largest) drafts through the ragged chain, on its own.
        ragged = [i for i in range(b) if i not in set(fixed)]
        tails = [i for i in ragged if reqs[i].depth_lag]  # lagging depths catch up before the chain
        if tails:
            self.catch_up_tails([reqs[i] for i in tails], [starts[i] for i in tails])
        if ragged:
            sub = to_device(ragged, torch.int64, dev) if fixed else slice(None)
            self.trunk_capture.restore(rows[sub], to_device([kept[i] for i in ragged], torch.int64, dev))
            self.draft([reqs[i] for i in ragged], [starts[i] for i in ragged],
                       [hidden[i * r : i * r + kept[i]] for i in ragged], self.k)  # fmt: skip
        if not fixed:
            return
        hidden = hidden.view(b, r, -1)
        if ragged:
            idx = to_device(fixed, torch.int64, dev)
            rows, ids, hidden = rows[idx], ids[idx], hidden[idx]
        reqs, starts = [reqs[i] for i in fixed], [starts[i] for i in fixed]
        lags, froms = self.draft_fixed(
            rows,
            starts,
            [kept[i] for i in fixed],
            [0 if q.finished else 1 for q in reqs],
            ids,
            [0 if q.finished else q.fill_ids[q.kv_len] for q in reqs],
            hidden,
            self.k,
            [q.depth_lag for q in reqs],
            [q.lag_from for q in reqs],
            first_mask=lambda: self._first_masks(reqs, self.k),  # host work while the trunk rolls back
        )
        for q, lag, f in zip(reqs, lags, froms):
            q.depth_lag, q.lag_from = lag, f
        self._walk_drafts(reqs, rows, self.k)

    def _fixed_shape_rows(self, reqs: list[Req], starts: list[int]) -> list[int]:
        """The requests DraftStep drafts (indices): with fixed shapes on, those past the tokens the
        depths skip and whose padded tokens stay inside the tables; none when they outnumber the
        graphs' largest batch."""
        if not self.fixed_shapes:
            return []
        limit = self.runner.req_to_token.max_context_len
        out = [i for i, s in enumerate(starts) if s >= self.step.min_start() and self.step.max_token(s) < limit]
        return [] if self.draft_graphs is not None and len(out) > self.draft_graphs.max_bs else out

    def _draft_step_covers(self, reqs: list[Req], starts: list[int]) -> bool:
        """DraftStep covers the whole batch (lagging.py's catch-up)."""
        return len(self._fixed_shape_rows(reqs, starts)) == len(reqs)

    def stats(self) -> dict:
        steps = self.num_verify_steps
        return {
            "speculative_adaptive": self.adaptive,
            "spec_num_drafts": self.k,
            "spec_draft_steps_by_k": list(self.k_steps),
            "spec_accept_rate_by_depth": self.tracker.measured(),
            "spec_accept_rate_by_depth_ewma": [round(x, 4) for x in self.tracker.rates],
            "spec_verified_drafts_by_depth": list(self.tracker.reached),
            "spec_step_costs": self.costs.as_dict() if self.costs is not None else None,
            "speculative_num_steps": self.num_steps,
            "spec_verify_steps": steps,
            "avg_spec_accept_length": self.num_verify_tokens / steps if steps else 0.0,
            "spec_verify_cuda_graph": self.verify_graphs is not None,
            "spec_draft_cuda_graph": self.draft_graphs is not None,
            "spec_cuda_graph_max_bs": self.draft_graphs.max_bs if self.draft_graphs is not None else 0,
            "spec_fixed_shape_draft_steps": self.num_fixed_shape_steps,
            "spec_verify_judged": dict(self.judged),
            "spec_sampled_cuda_graph_max_bs": max((g.sampled_buckets[-1] for g in (self.verify_graphs or {}).values()
                                                   if g.sampled_buckets), default=0),  # fmt: skip
            "spec_plain_decode_steps": self.num_plain_steps,
            "spec_depth_catch_ups": self.num_catch_ups,
            "spec_tail_catch_ups": self.num_tail_catch_ups,
        }
