"""TP 1 vs TP N on one node: greedy outputs, decode time per layer and communication time per layer.

    NCCL_NVLS_ENABLE=0 python benchmark/bench_tp.py --tp 1 2 --batch-size 1 64          # spawns the ranks
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 benchmark/bench_tp.py --batch-size 1 64  # one TP size
    python benchmark/bench_tp.py --config tiny --device cpu --tp 1 2 --batch-size 1 2    # smoke test (gloo)

inkling-slice (full width, 3 trunk layers) with dummy weights: every parameter is drawn at its full
shape from the same seeded generator and sliced, so all TP sizes run the same model. Per batch size:
a prefill of random prompts, then greedy decode. Timing: CUDA events at every trunk layer's start
and end (eager forward, so host launch gaps count at batch 1), medians over the timed steps; the
collectives (reduce-scatter and all-gather around the output short convs) are bracketed by their
own events, so communication per layer is measured, not inferred. With --cuda-graph the whole
decode step is also replayed from a CUDA graph (collectives included). Greedy tokens of every TP
size are compared with TP 1 (in bf16 the partial-sum order differs, so near-ties may flip: the
first divergent step and the logit differences at the first step are reported). Results of every
TP size accumulate in one JSON file under benchmark/results/ (torchrun runs one size per call).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_one_batch import Clock, Seqs, git_commit, graph_step_ms  # noqa: E402
from benchmark.tp_projection import project  # noqa: E402
from sgl_inkling.distributed import collectives  # noqa: E402
from sgl_inkling.distributed.launch import dist_init_method  # noqa: E402
from sgl_inkling.distributed.parallel_state import destroy_distributed, init_distributed  # noqa: E402
from sgl_inkling.model_executor.model_loader import build_model  # noqa: E402
from sgl_inkling.model_executor.model_runner import ModelRunner  # noqa: E402
from sgl_inkling.models.inkling.config import SLIDING, InklingConfig  # noqa: E402
from sgl_inkling.models.inkling.slice_config import slice_config  # noqa: E402
from sgl_inkling.models.inkling.tiny import TINY_CONFIG  # noqa: E402
from sgl_inkling.models.inkling.weights import init_dummy_weights  # noqa: E402

SAMPLED_VOCAB = 64  # logits compared across TP sizes at these many fixed vocabulary ids per row


def _config(name: str) -> InklingConfig:
    return slice_config() if name == "slice" else InklingConfig.from_dict(TINY_CONFIG)


def _layer_marks(model, clock: Clock, marks: list) -> list:
    handles = []
    for i, layer in enumerate(model.model.llm.layers):
        handles.append(layer.register_forward_pre_hook(lambda _m, _a, i=i: marks.append((i, "s", clock.mark()))))
        handles.append(layer.register_forward_hook(lambda _m, _a, _o, i=i: marks.append((i, "e", clock.mark()))))
    return handles


def run_batch(model, cfg, bsz: int, args, clock: Clock) -> dict:
    ctx = args.input_len + args.warmup_steps + 2 * args.decode_steps + 8
    runner = ModelRunner(model, bsz, ctx, bsz * ctx, attention_backend=args.attention_backend)
    seqs = Seqs(runner, bsz)
    gen = torch.Generator().manual_seed(args.seed + bsz)  # same prompts on every rank and TP size
    prompts = torch.randint(0, cfg.unpadded_vocab_size, (bsz, args.input_len), generator=gen).tolist()
    probe_ids = torch.randint(0, cfg.unpadded_vocab_size, (SAMPLED_VOCAB,), generator=gen)
    out = runner.forward(seqs.batch(prompts))
    first = out.logits[: min(bsz, 4)].float().cpu()
    tokens = [out.logits.argmax(-1).tolist()]

    n_layers = len(model.model.llm.layers)
    marks: list = []
    handles = _layer_marks(model, clock, marks)
    step_ms, layer_ms = [], [[] for _ in range(n_layers)]
    comm_ms: dict[str, list[float]] = {}
    for step in range(args.warmup_steps + args.decode_steps):
        marks.clear()
        collectives.timer = collectives.CommTimer(clock.cuda)
        batch = seqs.batch([[t] for t in tokens[-1]])
        a = clock.mark()
        out = runner.forward(batch)
        b = clock.mark()
        tokens.append(out.logits.argmax(-1).tolist())
        comm = collectives.timer.total_ms()  # syncs
        collectives.timer = None
        if step < args.warmup_steps:
            continue
        at = {(i, k): m for i, k, m in marks}
        step_ms.append(clock.ms(a, b))
        for i in range(n_layers):
            layer_ms[i].append(clock.ms(at[(i, "s")], at[(i, "e")]))
        for name in ("reduce_scatter", "all_gather"):
            comm_ms.setdefault(name, []).append(comm.get(name, 0.0) / n_layers)
    for h in handles:
        h.remove()

    graph_ms, graph_error, graph_layers_ms = None, None, None
    if args.cuda_graph and clock.cuda:
        try:
            last = [[t] for t in tokens[-1]]  # replayed steps need tokens that agree across ranks
            times, layers_total = graph_step_ms(runner, seqs, lambda _n: last, args.decode_steps)
            graph_ms = statistics.median(times)
            graph_layers_ms = layers_total / len(layer_ms)
        except Exception as e:  # report it, keep the eager figures
            graph_error = f"{type(e).__name__}: {e}"[:500]
    seqs.free()

    layers = [
        {"layer": i, "kind": "sliding" if cfg.layer_types[i] == SLIDING else "full", "ms": statistics.median(ms)}
        for i, ms in enumerate(layer_ms)
    ]
    comm = {k: statistics.median(v) for k, v in comm_ms.items()}
    layer_mean = statistics.fmean(x["ms"] for x in layers)
    comm_total = sum(comm.values())
    return {
        "batch_size": bsz,
        "decode_step_ms": statistics.median(step_ms),
        "layers": layers,
        "layer_ms_mean": layer_mean,
        "comm_ms_per_layer": {**comm, "total": comm_total},
        "compute_ms_per_layer": layer_mean - comm_total,
        "cuda_graph_step_ms": graph_ms,
        "cuda_graph_error": graph_error,
        "cuda_graph_layers_ms_per_layer": graph_layers_ms,  # trunk layers alone, collectives included
        "tokens": tokens,
        "first_step_logits_sample": first[:, probe_ids].tolist(),
        "first_step_argmax": first.argmax(-1).tolist(),
    }


def run_rank(rank: int, world: int, args, init_method: str, local_rank: int) -> dict | None:
    """One TP rank: join the group, build the sharded dummy model, run every batch size."""
    device = torch.device(f"cuda:{local_rank}" if args.device == "cuda" else "cpu")
    torch.set_grad_enabled(False)
    init_distributed(world, rank, args.ep, init_method, args.device, local_rank)
    try:
        cfg = _config(args.config)
        dtype = getattr(torch, args.dtype)
        model = build_model(cfg, dtype, device)
        init_dummy_weights(model, seed=args.seed)
        clock = Clock(device)
        clock.sync()
        runs = [run_batch(model, cfg.text, bsz, args, clock) for bsz in args.batch_size]
        weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
        return {"tp": world, "ep": args.ep, "weights_gb_per_rank": weights_gb, "runs": runs} if rank == 0 else None
    finally:
        destroy_distributed()


def _spawned(rank: int, world: int, args, init_method: str, out: str) -> None:
    res = run_rank(rank, world, args, init_method, rank)
    if res is not None:
        torch.save(res, out)


def run_spawn(world: int, args) -> dict:
    import multiprocessing as mp
    import tempfile

    ctx = mp.get_context("spawn")
    method = dist_init_method(argparse.Namespace(dist_init_addr=None))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        procs = [ctx.Process(target=_spawned, args=(r, world, args, method, out)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            raise SystemExit(f"TP {world}: a rank failed (exit codes {[p.exitcode for p in procs]})")
        return torch.load(out)


def compare(results: dict) -> dict:
    """Greedy tokens and first-step logits of every TP size against TP 1."""
    if "tp1" not in results:
        return {}
    out = {}
    for key, res in results.items():
        if key == "tp1":
            continue
        for ref, run in zip(results["tp1"]["runs"], res["runs"]):
            steps = [i for i, (x, y) in enumerate(zip(ref["tokens"], run["tokens"])) if x != y]
            a, b = torch.tensor(ref["first_step_logits_sample"]), torch.tensor(run["first_step_logits_sample"])
            out[f"{key}_bs{run['batch_size']}"] = {
                "tokens_equal": not steps,
                "first_divergent_step": steps[0] if steps else None,
                "steps_compared": min(len(ref["tokens"]), len(run["tokens"])),
                "first_step_argmax_equal": ref["first_step_argmax"] == run["first_step_argmax"],
                "first_step_logits_max_abs_diff": float((a - b).abs().max()),
                "first_step_logits_max_abs": float(a.abs().max()),
            }
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=("slice", "tiny"), default="slice")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2], help="TP sizes to spawn (ignored under torchrun)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size within each TP group (>1 needs TP > 1)")
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 64])
    p.add_argument("--input-len", type=int, default=None)
    p.add_argument("--decode-steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--cuda-graph", action="store_true", help="also time decode replayed from a CUDA graph")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", type=Path, default=None)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.attention_backend = "triton" if cuda else "torch_native"
    args.input_len = args.input_len or (1024 if args.config == "slice" else 40)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    name = "inkling-slice" if args.config == "slice" else "inkling-tiny"
    out = args.result_file or ROOT / "benchmark" / "results" / f"bench_tp_{name}_{args.device}.json"

    if "LOCAL_RANK" in os.environ:  # torchrun: this process is one rank of one TP size
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        res = run_rank(rank, world, args, "env://", int(os.environ["LOCAL_RANK"]))
        if res is None:
            return {}
        new = {f"tp{world}": res}
    else:
        new = {f"tp{n}": run_spawn(n, args) for n in args.tp}

    settings = {"batch_sizes": args.batch_size, "input_len": args.input_len, "dtype": args.dtype,
                "decode_steps": args.decode_steps, "warmup_steps": args.warmup_steps, "seed": args.seed}  # fmt: skip
    result = json.loads(out.read_text()) if out.exists() else {}
    if result.get("settings") != settings:
        result = {}  # a different experiment: start over rather than mix
    commit, dirty = git_commit()
    result.update({
        "benchmark": "bench_tp",
        "config": name,
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "torch": torch.__version__,
        "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
        "settings": settings,
    })  # fmt: skip
    result.setdefault("results", {}).update(new)
    result["greedy_vs_tp1"] = compare(result["results"])
    if args.config == "slice":  # the 66-layer model at the measured sizes and at 8 GPUs
        sizes = sorted({int(k[2:]) for k in result["results"]} | {8})
        result["projection_66_layers"] = [project(slice_config(), n) for n in sizes]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    for key, res in sorted(result["results"].items()):
        for r in res["runs"]:
            c = r["comm_ms_per_layer"]
            print(f"{key} bs{r['batch_size']:>3}: step {r['decode_step_ms']:.3f} ms, layer {r['layer_ms_mean']:.3f} ms "
                  f"(comm {c['total']:.3f}: rs {c.get('reduce_scatter', 0):.3f} ag {c.get('all_gather', 0):.3f}), "
                  f"graph step {r['cuda_graph_step_ms'] or '-'}, graph layers/layer "
                  f"{r.get('cuda_graph_layers_ms_per_layer') or '-'} {r['cuda_graph_error'] or ''}")  # fmt: skip
    print(json.dumps(result["greedy_vs_tp1"], indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
