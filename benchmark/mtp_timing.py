"""MTP timing for bench_one_batch: the verify step and the draft chain against their floors, and
tokens per second per user at forced acceptance lengths.

Forced acceptance is a benchmark-only switch (MTPWorker.forced_accept): with dummy weights the
depths' drafts are never right, so the accepted count is imposed to see what each length would
give. Each step: the trunk verifies K + 1 tokens per sequence (one extend), the forced number is
committed, and the draft step runs as serving runs it (DraftStep: the trunk's conv state restored
from the captured windows, then every depth consumes the committed tokens, the pending one and the
drafts before it, padded to fixed shapes). On CUDA both steps are also replayed from the serving
path's graphs (VerifyGraphRunner with the greedy acceptance inside, DraftGraphRunner).
"""

from __future__ import annotations

import statistics

import torch

from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.models.inkling.config import SLIDING
from sgl_inkling.models.inkling.slice_config import NUM_FULL_MODEL_LAYERS, NUM_FULL_MODEL_SLIDING
from sgl_inkling.speculative.draft_graphs import DraftGraphRunner
from sgl_inkling.speculative.mtp_worker import MTPWorker
from sgl_inkling.speculative.verify_graphs import VerifyGraphRunner


def chain_floor_bytes(model, cfg, bsz: int, seq_len: int, num_steps: int, nbytes) -> int:
    """Each depth reads its decoder layer, the shared final norm and LM head (one draft row per
    sequence), and its KV; the chain runs num_steps depths."""
    llm = model.model.llm
    total = 0
    for d in range(num_steps):
        layer = model.model.mtp.layers[d]
        spec = layer.transformer_block.attn.spec
        visible = min(seq_len, spec.window) if spec.window else seq_len
        kv = bsz * visible * 2 * spec.num_kv_heads * spec.head_dim * layer.input_proj.weight.element_size()
        total += nbytes(layer) + nbytes(llm.unembed) + nbytes(llm.norm) + kv
    return total


def run_mtp(model, cfg, bsz: int, args, gen, h) -> dict:
    """h: bench_one_batch's helpers (Clock, Probe, Seqs, layer_floor_bytes, nbytes, to_ms)."""
    k = args.mtp_steps
    clock = h.Clock(model.model.llm.embed.weight.device)
    steps_total = args.warmup_steps + args.decode_steps
    ctx = args.input_len + len(args.mtp_accept) * steps_total * (2 * k + 2) + 16
    runner = ModelRunner(model, bsz, ctx, bsz * ctx, attention_backend=args.attention_backend)
    worker = MTPWorker(runner, k, token_map=h.draft_token_map(cfg, args.mtp_token_map_size))
    seqs = h.Seqs(runner, bsz)

    def rand(n: int) -> list[list[int]]:
        return torch.randint(0, cfg.unpadded_vocab_size, (bsz, n), generator=gen).tolist()

    runner.forward(seqs.batch(rand(args.input_len)))
    draft_graphs = None
    if clock.cuda:
        try:
            draft_graphs = DraftGraphRunner(worker.step, bsz)
        except Exception as e:  # reported per run; the eager figures stand
            draft_graphs = f"{type(e).__name__}: {e}"[:500]
    probe = h.Probe(model, clock)
    probe.keep_inputs = True
    n_layers = len(model.model.llm.layers)
    out_runs = []
    for accept in args.mtp_accept:
        worker.forced_accept, worker._forced_credit = accept, 0.0
        verify_ms, chain_ms, head_ms, emitted = [], [], [], []
        layer_ms: list[list[float]] = [[] for _ in range(n_layers)]
        floors: list[list[int]] = [[] for _ in range(n_layers)]
        chain_floor = []
        for step in range(steps_total):
            starts = list(seqs.lens)
            vb = seqs.batch(rand(k + 1), logits_counts=[k + 1] * bsz)
            vb.sconv_capture = worker.trunk_capture
            probe.reset()
            a = clock.mark()
            out = runner.forward(vb)
            b = clock.mark()
            n = worker.forced_counts(bsz)[0] + 1
            seqs.lens = [x + n for x in starts]
            # Slots for the tokens the depths consume past the verified ones (pending + drafts).
            seqs.extra_slots(starts, k + 1, n + k)
            step_args = draft_step_args(seqs.rows, starts, n, vb, out, [t[0] for t in rand(1)])
            c = clock.mark()
            worker.step.run(*step_args, host_start=starts)
            e = clock.mark()
            clock.sync()
            if step < args.warmup_steps:
                continue
            marks = {(i, kind): m for i, kind, m in probe.marks}
            verify_ms.append(clock.ms(a, b))
            chain_ms.append(clock.ms(c, e))
            head_ms.append(clock.ms(marks[(n_layers - 1, "end")], b))
            emitted.append(n)
            for i, layer in enumerate(model.model.llm.layers):
                layer_ms[i].append(clock.ms(marks[(i, "start")], marks[(i, "end")]))
                floors[i].append(h.layer_floor_bytes(layer, cfg, [x + k + 1 for x in starts], probe.routed_ids(model, i)))
            chain_floor.append(chain_floor_bytes(model, cfg, bsz, max(seqs.lens), k, h.nbytes))
        layers = []
        for i in range(n_layers):
            med, floor = statistics.median(layer_ms[i]), h.to_ms(int(statistics.median(floors[i])))
            kind = "sliding" if cfg.layer_types[i] == SLIDING else "full"
            layers.append({"layer": i, "kind": kind, "ms": med, "floor_ms": floor, "achieved_fraction": floor / med})

        by_kind = {kind: [x for x in layers if x["kind"] == kind] or layers for kind in ("sliding", "full")}

        def mean(key: str, kind: str, by_kind=by_kind) -> float:
            return statistics.fmean(x[key] for x in by_kind[kind])

        llm = model.model.llm
        head_floor = h.to_ms(h.nbytes(llm.unembed) + h.nbytes(llm.norm) + bsz * (k + 1) * cfg.vocab_size * 4)
        verify, chain, head = statistics.median(verify_ms), statistics.median(chain_ms), statistics.median(head_ms)
        n_full = NUM_FULL_MODEL_LAYERS - NUM_FULL_MODEL_SLIDING
        verify66 = NUM_FULL_MODEL_SLIDING * mean("ms", "sliding") + n_full * mean("ms", "full") + head
        floor66 = NUM_FULL_MODEL_SLIDING * mean("floor_ms", "sliding") + n_full * mean("floor_ms", "full") + head_floor
        tokens = statistics.fmean(emitted)
        chain_floor_ms = h.to_ms(int(statistics.median(chain_floor)))
        out_runs.append({
            "forced_accept_length": accept,
            "benchmark_only_forced_acceptance": True,
            "tokens_per_step": tokens,
            "verify_ms": verify,
            "verify_floor_ms": sum(x["floor_ms"] for x in layers) + head_floor,
            "verify_lm_head_ms": head,
            "verify_layers": layers,
            "draft_chain_ms": chain,
            "draft_chain_floor_ms": chain_floor_ms,
            "draft_chain_achieved_fraction": chain_floor_ms / chain,
            "step_ms": verify + chain,
            "extrapolated_66_layers": {
                "verify_ms": verify66,
                "verify_floor_ms": floor66,
                "step_ms": verify66 + chain,
                "tok_per_s_per_user": tokens * 1e3 / (verify66 + chain),
                "floor_tok_per_s_per_user": tokens * 1e3 / (floor66 + chain_floor_ms),
            },
        })  # fmt: skip
        if draft_graphs is not None:  # the last step's inputs, replayed (the state moves the same way each time)
            out_runs[-1]["draft_chain_cuda_graph"] = graph_ms(draft_graphs, step_args, args.decode_steps, h.replay_ms)
    probe.remove()
    verify_graph = verify_graph_ms(runner, worker, seqs, rand, k, args.decode_steps, h.replay_ms) if clock.cuda else None
    if verify_graph and verify_graph["ms"]:
        for r in out_runs:
            add_graph_extrapolation(r, verify_graph["ms"])
    return {"batch_size": bsz, "num_steps": k, "verify_cuda_graph": verify_graph, "runs": out_runs}


def draft_step_args(rows: list[int], starts: list[int], kept: int, verify_batch, out, pending: list[int]) -> tuple:
    """DraftStep.run's arguments after a verify (`verify_batch`, its output `out`) of which every
    sequence keeps `kept` tokens and goes on with `pending`."""
    bsz, dev = len(rows), verify_batch.input_ids.device
    return (
        torch.tensor(rows, device=dev),
        torch.tensor(starts, device=dev),
        torch.full((bsz,), kept, device=dev),
        torch.ones(bsz, dtype=torch.int64, device=dev),
        verify_batch.input_ids.view(bsz, -1),
        torch.tensor(pending, device=dev),
        out.hidden.view(bsz, verify_batch.input_ids.shape[0] // bsz, -1),
    )


def graph_ms(graphs, step_args, steps: int, replay_ms) -> dict:
    """Median replay time of a DraftGraphRunner (or the capture error) on `step_args`."""
    if isinstance(graphs, str):
        return {"ms": None, "error": graphs}
    try:
        return {"ms": statistics.median(replay_ms(lambda: graphs.replay(*step_args, depths=graphs.depths[0]), steps)), "error": None}
    except Exception as e:  # report it; the eager figures stand
        return {"ms": None, "error": f"{type(e).__name__}: {e}"[:500]}


def add_graph_extrapolation(run: dict, verify_graph_ms: float) -> None:
    """66 layers with both steps from graphs: the eager 66-layer verify scaled by graph/eager."""
    chain = (run.get("draft_chain_cuda_graph") or {}).get("ms")
    if chain is None:
        return
    e = run["extrapolated_66_layers"]
    verify66 = e["verify_ms"] * verify_graph_ms / run["verify_ms"]
    e["cuda_graph_step_ms"] = verify66 + chain
    e["cuda_graph_tok_per_s_per_user"] = run["tokens_per_step"] * 1e3 / (verify66 + chain)


def verify_graph_ms(runner, worker, seqs, rand, k: int, steps: int, replay_ms) -> dict:
    """Verify steps (K + 1 tokens per sequence, greedy acceptance included) through the serving
    path's VerifyGraphRunner; returns the median or the capture error."""
    try:
        bsz = len(seqs.rows)
        graphs = VerifyGraphRunner(runner, k + 1, worker.trunk_capture, bsz)
        current = []

        def refill() -> None:
            current[:] = [seqs.batch(rand(k + 1), logits_counts=[k + 1] * bsz)]

        limits = torch.full((bsz,), k, device=runner.device)
        forced = torch.full((bsz,), -1, device=runner.device)
        times = replay_ms(lambda: graphs.replay(current[0], limits, forced), steps, refill)
        return {"ms": statistics.median(times), "error": None}
    except Exception as e:  # report it; the eager figures stand
        return {"ms": None, "error": f"{type(e).__name__}: {e}"[:500]}
