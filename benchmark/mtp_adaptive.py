"""Adaptive MTP for bench_one_batch --mtp: tokens per second per user when drafts are accepted at a
forced per-depth curve, for every fixed number of drafts k = 1..K and for the adaptive chooser.

The curve (--mtp-accept-curve, default the public Inkling MTP8 one) gives a_d, the chance that the
first d drafts are all accepted; each step draws every request's accepted count from it
(MTPWorker.forced_curve, a benchmark-only switch: with dummy weights no draft is ever right). Steps
run as serving runs them: the verify of k + 1 tokens per request (its graph on CUDA, greedy rule
with the forced counts inside), one read of the decisions, then the draft step for the next k (its
graph per (bucket, k) on CUDA; the depths past k skip it and catch up now and then, as serving's
MTPWorker.draft_fixed runs them, so a fixed k's draft time is a mean over steps with and without a
catch-up). When the adaptive chooser picks k = 0 the step is the plain decode
step (the decode graph of the bucket) and the depths lag, as in serving (speculative/lagging.py):
their catch-up (every K + 1 plain steps, and drafting when a later step picks k > 0) is timed as
that step's draft part. Two adaptive runs pick k from step costs measured as MTPWorker measures
them at start-up, with the trunk's part scaled to 66 layers like the table's figure: "adaptive"
starts, as serving does, from the public curve as its prior and learns from its own steps (untimed
warm-up); "learned" starts from flat estimates (0.5 per depth) and first learns for
--mtp-learn-steps steps on the host alone (the acceptance is forced, so the chooser sees what the
GPU steps would show it; batch 1 needs a few hundred steps to leave plain decode), to show the
chooser finds the curve by itself. Both time --mtp-adaptive-steps steps, enough for exploration to
show at about its real share. Beside the timed figures, "long run": the chooser alone on the host
for LONG_RUN steps from each prior, drawing the forced curve, each step charged the fixed-k run's
step time at 66 layers (the speed of its choices over a long run, free of the timed steps' few
samples). Timed regions start behind a GPU busy-wait that covers
the host's staging of the step (Clock.start), so a host gap is not scaled to 66 layers as if it
were trunk work. The 66-layer figure adds to each trunk forward (verify, plain decode) 63 more
layers at the time of its width's layers alone (a layers-only CUDA graph of the slice's 3 layers at
that width, extrapolate_66), so the once-a-step part (embedding, LM head, acceptance rule) counts
once, and keeps the draft step as measured (the 8 MTP depths are full size in the slice): an
approximation, labelled as such. (Before 2026-12-07's change it scaled the step less the LM head's
floor by 22, which charged the rest of the once-a-step part 22 times: 14.8 against 13.8 ms a plain
batch-1 step on the H200.) The chooser's cost table is projected the same way.
"""

from __future__ import annotations

import gc
import random
import statistics
from collections import Counter

import torch

from sgl_inkling.model_executor.cuda_graph_runner import bucket_for, buckets_up_to
from sgl_inkling.model_executor.forward_batch import ForwardMode
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.models.inkling.slice_config import NUM_FULL_MODEL_LAYERS
from sgl_inkling.speculative.acceptance import greedy_accept
from sgl_inkling.speculative.adaptive import AcceptanceTracker, StepCosts, conditional_rates, expected_tokens
from sgl_inkling.speculative.draft_control import DraftControl
from sgl_inkling.speculative.mtp_worker import MTPWorker
from sgl_inkling.speculative.step_costs import measure_step_costs

LONG_RUN = 4000  # host-only steps of the long-run figure
LAYER_REPS = 20  # replays of each width's layers-only graph (median)
FLAT_PRIOR = [0.5]


def run_adaptive(model, cfg, bsz: int, args, gen, h) -> dict | None:
    """h: bench_one_batch's helpers (Clock, Seqs, nbytes, to_ms). None where the MTP graphs do not
    cover the batch (the other batch sizes' results are still written)."""
    result = _run_adaptive(model, cfg, bsz, args, gen, h)
    # The runner's pools and the worker's graphs (reference cycles) go before the next batch size's
    # graphs are sized from the free memory: left cached, they cut an 80 GB card's batch-8 graphs to 4.
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def timed_buckets(bsz: int) -> list[int]:
    """The graph batch sizes a batch of bsz is timed with: the standard buckets up to 32 and bsz. The
    verify graphs' kept logits add up over buckets, and those from 40 to 56 cut an 80 GB card's batch-64
    MTP graphs to 48; the small ones stay, since a tail catch-up runs only the requests whose lag
    buffers filled (about 10-20 of 64) padded to the next bucket: with bsz alone (24ab9bd) every
    catch-up ran 64 rows, and the batch-64 draft steps took 23-27 ms whatever k."""
    return [b for b in buckets_up_to(bsz) if b <= 32 or b == bsz]


def _run_adaptive(model, cfg, bsz: int, args, gen, h) -> dict | None:
    k_max = args.mtp_steps
    curve = list(args.mtp_accept_curve)[:k_max]
    clock = h.Clock(model.model.llm.embed.weight.device)
    # k = 0 is plain decode timed the same way, the base of the speed-ups (and a fixed k like the rest).
    modes: list[int | str] = [*range(0, k_max + 1), "adaptive", "learned"]
    learn = {"adaptive": args.mtp_adaptive_warmup, "learned": args.mtp_adaptive_warmup}  # GPU warm-up steps
    timed = args.warmup_steps + max(args.decode_steps, args.mtp_adaptive_steps)
    # Every mode starts from the prompt (Seqs.rewind): a step takes at most 2K + 2 slots per sequence.
    ctx = args.input_len + (timed + max(learn.values())) * (2 * k_max + 2) + 16
    runner = ModelRunner(model, bsz, ctx, bsz * ctx, attention_backend=args.attention_backend,
                         cuda_graph_max_bs=bsz if clock.cuda else 0, cuda_graph_bs=timed_buckets(bsz))  # fmt: skip
    worker = MTPWorker(runner, k_max, adaptive=True, token_map=h.draft_token_map(cfg, args.mtp_token_map_size))
    seqs = h.Seqs(runner, bsz)

    def rand(n: int) -> list[list[int]]:
        return torch.randint(0, cfg.unpadded_vocab_size, (bsz, n), generator=gen).tolist()

    runner.forward(seqs.batch(rand(args.input_len)))
    prompt = seqs.mark()
    head_floor = h.to_ms(h.nbytes(model.model.llm.unembed))
    trunk_scale = NUM_FULL_MODEL_LAYERS / len(model.model.llm.layers)
    # The trunk's layers alone at each verify width r (1: plain decode), from a layers-only CUDA graph:
    # a step's 66-layer figure is its time plus (trunk_scale - 1) x its layers' time (extrapolate_66).
    layers_ms = _layer_times(worker, runner, seqs, prompt, rand, bsz, h) if clock.cuda else {}
    # The chooser sees the costs of the model the table projects to (the trunk's forwards scaled to 66
    # layers as below, the draft steps as measured): on the 3-layer slice itself plain decode is the
    # cheapest way to a token, which says nothing about the served model.
    if worker.draft_graphs is not None and worker.draft_graphs.max_bs < bsz:
        print(f"mtp_adaptive: batch {bsz} skipped: MTP graphs were captured up to batch {worker.draft_graphs.max_bs} "
              "only (the free memory left for their logits), and eager steps would be timed instead")  # fmt: skip
        return None
    bucket = bucket_for(worker.draft_graphs.buckets, bsz) if worker.draft_graphs is not None else bsz
    worker.costs = measure_step_costs(worker, trunk_scale=trunk_scale, head_s=head_floor / 1e3, context=args.input_len,
                                      trunk_layers_s={(bucket, r): ms / 1e3 for r, ms in layers_ms.items()})  # fmt: skip
    # A drafting step rolls the trunk's conv state back (conv_rollback, one launch): its bytes grow
    # with the layers, and the draft step timed here rolls back only the slice's. Projected at the
    # bandwidth for the other layers (read and write of K-1 positions of every channel a request).
    pool, layers = runner.sconv_pool, len(model.model.llm.layers)
    trunk_channels = pool.channels[layers - 1][1] - pool.channels[0][0]
    rollback66 = h.to_ms(2 * bsz * pool.width * trunk_channels * 4 * (trunk_scale - 1))
    rates = conditional_rates(curve)
    out = []
    for mode in modes:
        seqs.rewind(prompt)  # the same context length for every mode
        adaptive = mode in learn
        worker.configure(adaptive=adaptive, costs=worker.costs)
        worker.tracker = AcceptanceTracker(k_max, prior=FLAT_PRIOR if mode == "learned" else None)
        worker.forced_curve = curve
        if mode == "learned":
            _learn_on_host(worker, bsz, args.mtp_learn_steps)
        k = worker.choose(bsz) if adaptive else mode
        warm = args.warmup_steps + learn.get(mode, 0)
        # With tails a fixed k's draft steps differ too (some catch the depths past k up): as many
        # steps as the adaptive runs, and means of them.
        steps = args.mtp_adaptive_steps if adaptive or worker.tail_lag else args.decode_steps
        verify_ms, draft_ms, tokens, ks = [], [], [], []
        lag = [0]  # plain steps the depths are behind (the same for every sequence of the batch)
        tails = {"lags": [0] * bsz, "froms": [0] * bsz}  # depths past k behind (lagging.py), per sequence
        for step in range(warm + steps):
            if k == 0:
                k_next, times, emitted = _plain_step(worker, runner, seqs, clock, rand, lag, adaptive, bsz)
            else:
                k_next, times, emitted = _step(worker, runner, seqs, clock, rand, k, tails, adaptive, bsz)
            if step >= warm:
                verify_ms.append(times[0])
                draft_ms.append(times[1])
                tokens.append(emitted)
                ks.append(k)
            k = k_next
        # The curve is forced, so the expected tokens of the k actually drafted are exact; the sampled
        # mean (a few steps) only shows the forcing works. A fixed k repeats one step: medians. The
        # adaptive runs mix steps of different k: means of whole steps (a median of verify times plus
        # one of draft times mixes plain steps' verifies with drafting steps' drafts).
        per_step = statistics.fmean(expected_tokens(rates, x) for x in ks)
        avg = statistics.fmean if adaptive else statistics.median
        verify, draft = avg(verify_ms), (statistics.fmean if worker.tail_lag else avg)(draft_ms)
        verify66 = avg([extrapolate_66(v, x, layers_ms, trunk_scale, head_floor) for v, x in zip(verify_ms, ks)])
        verify66 += rollback66 * sum(x > 0 for x in ks) / len(ks)
        out.append({
            "k": mode,
            "k_used": dict(Counter(ks)),
            "tokens_per_step": per_step,
            "sampled_tokens_per_step": statistics.fmean(tokens),
            "verify_ms": verify,
            "draft_ms": draft,
            "step_ms": verify + draft,
            "tok_per_s_per_user": per_step * 1e3 / (verify + draft),
            "extrapolated_66_layers": {"verify_ms": verify66, "step_ms": verify66 + draft,
                                       "tok_per_s_per_user": per_step * 1e3 / (verify66 + draft)},
        })  # fmt: skip
    worker.forced_curve = None
    seqs.free()
    def tps(r: dict) -> float:
        return r["extrapolated_66_layers"]["tok_per_s_per_user"]

    best = max((r for r in out if r["k"] not in learn), key=tps)
    by_mode = {r["k"]: r for r in out}
    fixed66 = [by_mode[k]["extrapolated_66_layers"]["step_ms"] for k in range(k_max + 1)]
    long_runs = {m: long_run(worker.costs, bsz, curve, fixed66, prior) for m, prior in (("adaptive", None), ("learned", FLAT_PRIOR))}
    return {
        "batch_size": bsz,
        "num_steps": k_max,
        "benchmark_only_forced_acceptance_curve": curve,
        "cuda_graphs": worker.verify_graphs is not None,
        "step_costs": worker.costs.as_dict(),
        # Projected, in every drafting step's 66-layer figure: the other 63 layers' conv rollback bytes.
        "trunk_rollback_other_layers_ms_projected": rollback66,
        "runs": out,
        "best_fixed_k": best["k"],
        # Plain decode without MTP: the k = 0 run's forward alone (no lagging depths to catch up).
        "plain_tok_per_s_per_user_66": 1e3 / by_mode[0]["extrapolated_66_layers"]["verify_ms"],
        # The trunk's layers alone per verify width (1: plain decode), ms: what the 66-layer figures scale.
        "trunk_layers_ms_by_width": layers_ms or None,
        "adaptive_vs_best_fixed": tps(by_mode["adaptive"]) / tps(best),
        "learned_vs_best_fixed": tps(by_mode["learned"]) / tps(best),
        "adaptive_from_choices_vs_best_fixed": from_choices(out, "adaptive", curve) / tps(best),  # k = 0 ran
        "learned_host_steps": args.mtp_learn_steps,
        "learned_warmup_steps": learn["learned"],
        # The chooser alone for LONG_RUN steps, each at the fixed-k step time at 66 layers (long_run).
        "adaptive_long_run_vs_best_fixed": long_runs["adaptive"]["tok_per_s_per_user_66"] / tps(best),
        "learned_long_run_vs_best_fixed": long_runs["learned"]["tok_per_s_per_user_66"] / tps(best),
        "long_runs": long_runs,
        "learned_acceptance_estimates": [round(x, 3) for x in worker.tracker.estimates()],
    }


def extrapolate_66(step_ms: float, k: int, layers_ms: dict[int, float], trunk_scale: float, head_ms: float) -> float:
    """A trunk forward of the slice (a verify of k + 1 tokens; k = 0: plain decode) at 66 layers: the
    step plus (trunk_scale - 1) x the slice's layers alone at that width, so what runs once a step
    (embedding, LM head, the acceptance rule) counts once. Without layer times (no CUDA): the step
    less the LM head's floor, scaled, which charges the rest of that once-a-step part 22 times (the
    formula before; at batch 1 on the H200 it made plain decode 14.8 ms a step against the 13.8 of
    its layers-only graph)."""
    layers = layers_ms.get(k + 1)
    if layers is None:
        return max(step_ms - head_ms, 0.0) * trunk_scale + head_ms
    return step_ms + (trunk_scale - 1) * layers


def _layer_times(worker: MTPWorker, runner, seqs, prompt, rand, bsz: int, h) -> dict[int, float]:
    """ms of the trunk's layers alone (bench_one_batch.graph_layers_ms) at every verify width
    r = 1..K + 1 (r = 1: a decode batch, as plain decode runs; r > 1: the verify's extend batch with
    its conv windows captured), each batch prepared by one eager forward at the prompt's context. A
    width whose layers fail to capture is left out (extrapolate_66 then scales its whole step)."""
    out = {}
    for r in range(1, worker.num_steps + 2):
        seqs.rewind(prompt)
        batch = seqs.batch(rand(r), logits_counts=[r] * bsz) if r > 1 else seqs.batch(rand(1))
        if r > 1:
            batch.mode = ForwardMode.EXTEND
            batch.sconv_capture = worker.trunk_capture
        runner.forward_eager(batch)
        try:
            out[r] = h.graph_layers_ms(runner, batch, LAYER_REPS)
        except RuntimeError as e:  # a width whose layers do not capture: its figures scale the step instead
            print(f"mtp_adaptive: no layers-only graph at width {r} ({str(e).splitlines()[0][:200]})")
            torch.cuda.synchronize()
    seqs.rewind(prompt)
    return out


def _learn_on_host(worker: MTPWorker, bsz: int, steps: int) -> None:
    """The chooser's side of `steps` serving steps without the GPU: it picks k, the forced curve
    says what each request accepts (as greedy_accept caps it), the chooser observes that."""
    for _ in range(steps):
        k = worker.choose(bsz)
        if k:
            worker.observe([min(a, k) for a in worker.forced_counts(bsz)], [k] * bsz)


def long_run(costs: StepCosts, bsz: int, curve: list[float], step_ms: list[float], prior: list[float] | None,
             steps: int = LONG_RUN, seed: int = 0) -> dict:  # fmt: skip
    """A fresh chooser (as MTPWorker's, with the measured costs and the given prior) for `steps`
    steps on the host under the forced curve; each step is charged step_ms[k] (the fixed-k runs'
    66-layer step times) and counted its expected tokens under the curve. Also: the first step
    whose k is within 3% of the best fixed k, and the k it used."""
    c = DraftControl()
    c.num_steps = len(step_ms) - 1
    c._init_draft_control(c.num_steps, adaptive=True)
    c.costs, c.tracker = costs, AcceptanceTracker(c.num_steps, prior=prior)
    c.forced_curve, c._forced_rng = list(curve), random.Random(seed)
    rates = conditional_rates(curve)
    speeds = [expected_tokens(rates, k) / t for k, t in enumerate(step_ms)]
    ks = []
    for _ in range(steps):
        k = c.choose(bsz)
        if k:
            c.observe([min(a, k) for a in c.forced_counts(bsz)], [k] * bsz)
        ks.append(k)
    tokens = sum(expected_tokens(rates, k) for k in ks)
    return {
        "steps": steps,
        "tok_per_s_per_user_66": tokens * 1e3 / sum(step_ms[k] for k in ks),
        "first_step_within_3pct_of_best": next((i for i, k in enumerate(ks) if speeds[k] >= 0.97 * max(speeds)), None),
        "k_used": dict(sorted(Counter(ks).items())),
        "exploration_spent_over_earned": c.explorer.spent / c.explorer.earned if c.explorer.earned else None,
    }


def from_choices(runs: list[dict], mode: str, curve: list[float]) -> float | None:
    """tok/s/user at 66 layers of an adaptive run rebuilt from the k it chose (k_used) and the fixed-k
    runs' step times at 66 layers: its tokens over its time, free of the few timed steps' noise."""
    rates = conditional_rates(curve)
    fixed = {r["k"]: r["extrapolated_66_layers"]["step_ms"] for r in runs if isinstance(r["k"], int)}
    used = {int(k): n for k, n in next(r for r in runs if r["k"] == mode)["k_used"].items()}
    if not used.keys() <= fixed.keys():  # an older run without the k = 0 row
        return None
    tokens = sum(n * expected_tokens(rates, k) for k, n in used.items())
    return tokens * 1e3 / sum(n * fixed[k] for k, n in used.items())


def _step(worker: MTPWorker, runner, seqs, clock, rand, k: int, tails: dict, adaptive: bool,
          bsz: int) -> tuple[int, tuple, float]:  # fmt: skip
    """One verify of k drafts and the draft step after it (MTPWorker.draft_fixed, as serving runs it:
    the depths past the next k skip it and catch up now and then); returns (next k, (verify ms,
    draft ms), mean tokens emitted)."""
    dev = runner.device
    starts = list(seqs.lens)
    vb = seqs.batch(rand(k + 1), logits_counts=[k + 1] * bsz)
    vb.mode = ForwardMode.EXTEND  # a one-token verify (k = 0) is still a verify: its conv windows are captured
    vb.sconv_capture = worker.trunk_capture
    ids = vb.input_ids.view(bsz, k + 1)
    limits = torch.full((bsz,), k, dtype=torch.int64, device=dev)
    forced = torch.tensor(worker.forced_counts(bsz), dtype=torch.int64, device=dev)
    a = clock.start()
    graphs = (worker.verify_graphs or {}).get(k + 1)
    if graphs is not None and graphs.can_run(vb):
        res, acc = graphs.replay(vb, limits, forced)
    else:
        res = runner.forward(vb)
        acc = greedy_accept(res.logits.view(bsz, k + 1, -1), ids, limits, forced)
    accepted = acc.lengths.tolist()  # the step's one read, as in serving
    b = clock.mark()
    worker.observe(accepted, [k] * bsz)
    k_next = worker.choose(bsz) if adaptive else k
    kept = [x + 1 for x in accepted]
    seqs.lens = [s + n for s, n in zip(starts, kept)]
    seqs.extra_slots(starts, k + 1, max(kept) + worker.num_steps + 1)
    rows, pending, hidden = torch.tensor(seqs.rows, device=dev), [t[0] for t in rand(1)], res.hidden.view(bsz, k + 1, -1)
    c = clock.start()
    tails["lags"], tails["froms"] = worker.draft_fixed(rows, starts, kept, [1] * bsz, ids, pending, hidden, k_next,
                                                       tails["lags"], tails["froms"])  # fmt: skip
    e = clock.mark()
    clock.sync()
    return k_next, (clock.ms(a, b), clock.ms(c, e)), statistics.fmean(kept)


def _plain_step(worker: MTPWorker, runner, seqs, clock, rand, lag: list[int], adaptive: bool,
                bsz: int) -> tuple[int, tuple, float]:  # fmt: skip
    """k = 0: one plain decode step; the depths catch up when their buffers are full (before the
    step) or when the next step drafts (after it); no tail lags then (a step drafting 0 catches
    them up). Returns what _step does."""
    dev, cap = runner.device, worker.lag_capacity
    rows = torch.tensor(seqs.rows, device=dev)
    a = clock.start()
    if lag[0] == cap:
        _catch_up(worker, seqs, rows, lag, 0, rand, bsz)
    a_end = clock.mark()
    fb = seqs.batch(rand(1))  # one token per sequence: a decode batch (its graph on CUDA)
    b = clock.start()
    out = runner.forward(fb)
    c = clock.mark()
    worker.lag_ids[rows, lag[0]] = fb.input_ids
    worker.lag_hidden[rows, lag[0]] = out.hidden.float()
    lag[0] += 1
    k_next = worker.choose(bsz) if adaptive else 0
    d = clock.start()
    if k_next:
        _catch_up(worker, seqs, rows, lag, k_next, rand, bsz)
    e = clock.mark()
    clock.sync()
    return k_next, (clock.ms(b, c), clock.ms(a, a_end) + clock.ms(d, e)), 1.0


def _catch_up(worker: MTPWorker, seqs, rows, lag: list[int], k: int, rand, bsz: int) -> None:
    """The depths consume the lagged tokens, then draft k (slots for the pending token and drafts)."""
    lens = list(seqs.lens)
    seqs.extra_slots(lens, 0, worker.num_steps + 1)
    starts = [n - lag[0] for n in lens]
    worker.catch_up_rows(rows, starts, [lag[0]] * bsz, [1] * bsz, [t[0] for t in rand(1)], k)
    lag[0] = 0


def plain_tok_per_s_66(runs: list[dict], bs: int) -> float | None:
    """Plain decode's tok/s/user at 66 layers for batch bs (from its CUDA graph where it ran)."""
    plain = [r for r in runs if r["batch_size"] == bs]
    if not plain:
        return None
    e = plain[-1]["extrapolated_66_layers"]
    return e.get("cuda_graph_tok_per_s_per_user") or e["tok_per_s_per_user"]


def print_adaptive_table(results: list[dict], runs: list[dict]) -> None:
    """Per batch size: each fixed k and adaptive; tok/s/user measured and at 66 layers, x plain."""
    print(f"{'bs':>3} {'k':>8} {'tok/step':>8} {'verify ms':>9} {'draft ms':>8} {'tok/s/user':>10} "
          f"{'@66':>8} {'x plain':>7}")  # fmt: skip
    for m in results:
        base = m.get("plain_tok_per_s_per_user_66") or plain_tok_per_s_66(runs, m["batch_size"])
        for r in m["runs"]:
            tps66 = r["extrapolated_66_layers"]["tok_per_s_per_user"]
            ratio = tps66 / base if base else float("nan")
            print(f"{m['batch_size']:>3} {str(r['k']):>8} {r['tokens_per_step']:>8.2f} {r['verify_ms']:>9.3f} "
                  f"{r['draft_ms']:>8.3f} {r['tok_per_s_per_user']:>10.1f} {tps66:>8.1f} {ratio:>7.2f}")  # fmt: skip
        print(f"    adaptive / best fixed (k={m['best_fixed_k']}): {m['adaptive_vs_best_fixed']:.3f} timed, "
              f"{m['adaptive_from_choices_vs_best_fixed']:.3f} its choices, {m['adaptive_long_run_vs_best_fixed']:.3f} "
              f"long run; learned from a flat prior: {m['learned_vs_best_fixed']:.3f} timed, "
              f"{m['learned_long_run_vs_best_fixed']:.3f} long run (first within 3% of the best k at step "
              f"{m['long_runs']['learned']['first_step_within_3pct_of_best']})")  # fmt: skip
