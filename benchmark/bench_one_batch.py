"""Static-batch latency through the model runner: prefill time, then decode step time per trunk
layer and for the LM head, against the memory-bandwidth floor (bytes that must be read / the card's ceiling,
benchmark/hbm_ceiling.py: 4.3 TB/s on the H200).

    python benchmark/bench_one_batch.py --config slice --batch-size 1 64        # on the H200
    python benchmark/bench_one_batch.py --config tiny --device cpu --batch-size 1 2   # smoke test
    python benchmark/bench_one_batch.py --config slice --batch-size 1 64 --quantization modelopt_fp4  # NVFP4 experts

Weights are dummy (initialised on the device). Timing: CUDA events around the forward and at each
layer boundary (forward hooks), warm-up first, medians over the timed steps. The floor of a layer
counts its attention weights, norms and short convs, the router, the shared experts, the distinct
routed experts the batch actually selected in that step (with NVFP4 experts, their codes and
block scales: 0.5625 bytes per weight), the KV it reads and the conv state it reads and writes. Writes one JSON file under benchmark/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.hbm_ceiling import peak_tb_s  # noqa: E402
from benchmark.moe_build import apply as apply_moe_build  # noqa: E402
from sgl_inkling.model_executor.cuda_graph_runner import capture_forward  # noqa: E402
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from sgl_inkling.model_executor.model_loader import build_model, quantize_drafts, with_expert_quant  # noqa: E402
from sgl_inkling.model_executor.model_runner import ModelRunner  # noqa: E402
from sgl_inkling.models.inkling.config import SLIDING, InklingConfig  # noqa: E402
from sgl_inkling.models.inkling.moe import MoE  # noqa: E402
from sgl_inkling.models.inkling.quant_config import NVFP4_METHODS, resolve_quantization  # noqa: E402
from sgl_inkling.models.inkling.slice_config import (  # noqa: E402
    NUM_FULL_MODEL_LAYERS,
    NUM_FULL_MODEL_SLIDING,
    slice_config,
)
from sgl_inkling.models.inkling.tiny import TINY_CONFIG  # noqa: E402
from sgl_inkling.models.inkling.weights import init_dummy_weights  # noqa: E402
from sgl_inkling.speculative.adaptive import PUBLIC_MTP8_CURVE  # noqa: E402
from sgl_inkling_kernels import dense_gemv  # noqa: E402
from sgl_inkling_kernels._triton import kernel_dispatch, no_pdl  # noqa: E402
from sgl_inkling_kernels.dense_gemv import GemvTiles, cublas_projections, gemv_tiles  # noqa: E402

BATCH_TENSORS = ("input_ids", "positions", "req_pool_indices", "prefix_lens", "extend_lens", "out_loc",
                 "out_loc_swa", "logits_indices")  # fmt: skip



COVER_CYCLES = 2_000_000  # about 1 ms of GPU clock: longer than the host's staging of one step


class Clock:
    """CUDA events on the GPU (no sync while recording), perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def start(self):
        """A mark behind a GPU busy-wait of COVER_CYCLES: the host stages the timed step's inputs and
        launches while the GPU still waits, so the region holds the GPU's work only."""
        if self.cuda:
            torch.cuda._sleep(COVER_CYCLES)
        return self.mark()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


class Probe:
    """Marks every trunk layer's start and end, and keeps each MoE's input (no host sync).

    The routing a step used is recomputed from those inputs afterwards, outside the timing, with the
    model's torch router (the kernel router selects the same experts).
    """

    def __init__(self, model, clock: Clock):
        self.clock = clock
        self.marks: list[tuple[int, str, object]] = []
        self.moe_inputs: dict[int, torch.Tensor] = {}
        self.keep_inputs = False
        self.handles = []
        for i, layer in enumerate(model.model.llm.layers):
            self.handles.append(layer.register_forward_pre_hook(
                lambda _m, _a, i=i: self.marks.append((i, "start", clock.mark()))))  # fmt: skip
            self.handles.append(layer.register_forward_hook(
                lambda _m, _a, _o, i=i: self.marks.append((i, "end", clock.mark()))))  # fmt: skip
            if isinstance(layer.mlp, MoE):
                self.handles.append(layer.mlp.register_forward_pre_hook(lambda _m, a, i=i: self._keep(i, a[0])))

    def _keep(self, i: int, x: torch.Tensor) -> None:
        if self.keep_inputs:
            self.moe_inputs[i] = x

    def routed_ids(self, model, i: int) -> torch.Tensor | None:
        x = self.moe_inputs.get(i)
        return None if x is None else model.model.llm.layers[i].mlp.gate(x)[0]

    def reset(self) -> None:
        self.marks.clear()
        self.moe_inputs.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def nbytes(module_or_tensors) -> int:
    params = module_or_tensors.parameters() if hasattr(module_or_tensors, "parameters") else module_or_tensors
    return sum(p.numel() * p.element_size() for p in params)


def layer_floor_bytes(layer, cfg, seq_lens: list[int], routed_ids: torch.Tensor | None) -> int:
    """Bytes one decode step must move through this layer (weights read once per step)."""
    mlp = layer.mlp
    total = nbytes(layer) - nbytes(mlp)  # attention, norms, short convs
    if isinstance(mlp, MoE):
        total += nbytes(mlp.gate) + nbytes(mlp.shared_experts)
        # One expert's slice of every routed-expert tensor: w13 and w2, and with NVFP4 their block
        # scales and scale2 (codes 0.5 + scales 1/16 bytes per weight).
        per_expert = sum(p[0].numel() * p.element_size() for p in mlp.experts.parameters())
        total += int(torch.unique(routed_ids).numel()) * per_expert
    else:
        total += nbytes(mlp)
    spec = layer.attn.spec
    visible = sum(min(n, spec.window) if spec.window else n for n in seq_lens)
    total += visible * 2 * spec.num_kv_heads * spec.head_dim * layer.attn.wk_dv.weight.element_size()
    # Conv state of the four streams, read and written in fp32.
    chans = 2 * spec.num_kv_heads * spec.head_dim + 2 * cfg.hidden_size
    total += 2 * len(seq_lens) * (cfg.conv_kernel_size - 1) * chans * 4
    return total


def to_ms(nbytes_: int) -> float:
    return nbytes_ / (peak_tb_s() * 1e12) * 1e3


class Seqs:
    """Rows and KV slots for a static batch, allocated like SeqRunner does."""

    def __init__(self, runner: ModelRunner, bsz: int):
        self.runner = runner
        self.rows = [runner.req_to_token.alloc() for _ in range(bsz)]
        self.lens = [0] * bsz
        self.slots: list[tuple[torch.Tensor, torch.Tensor]] = []

    def batch(self, tokens: list[list[int]], logits_counts: list[int] | None = None) -> ForwardBatch:
        r = self.runner
        full_all, swa_all = [], []
        for i, (row, toks) in enumerate(zip(self.rows, tokens)):
            n = len(toks)
            full, swa = r.full_pool.allocator.alloc(n), r.swa_pool.allocator.alloc(n)
            r.req_to_token.write("full", row, self.lens[i], full)
            r.req_to_token.write("swa", row, self.lens[i], swa)
            self.slots.append((full, swa))
            full_all.append(full)
            swa_all.append(swa)
        mode = ForwardMode.DECODE if all(len(t) == 1 for t in tokens) else ForwardMode.EXTEND
        batch = ForwardBatch.build(mode, tokens, self.rows, list(self.lens), torch.cat(full_all).tolist(),
                                   torch.cat(swa_all).tolist(), r.device, logits_counts=logits_counts)  # fmt: skip
        self.lens = [n + len(t) for n, t in zip(self.lens, tokens)]
        return batch

    def extra_slots(self, starts: list[int], have: int, need: int) -> None:
        """Slots for positions [start + have, start + need) of every sequence (MTP drafts)."""
        r = self.runner
        if need <= have:
            return
        for row, start in zip(self.rows, starts):
            full, swa = r.full_pool.allocator.alloc(need - have), r.swa_pool.allocator.alloc(need - have)
            r.req_to_token.write("full", row, start + have, full)
            r.req_to_token.write("swa", row, start + have, swa)
            self.slots.append((full, swa))

    def mark(self) -> tuple[list[int], int]:
        return list(self.lens), len(self.slots)

    def rewind(self, mark: tuple[list[int], int]) -> None:
        """Back to the lengths of `mark`, the KV slots taken since then freed (the sequences' state
        past it is stale, which timing on dummy weights does not mind)."""
        r = self.runner
        lens, n = mark
        for full, swa in self.slots[n:]:
            r.full_pool.allocator.free(full)
            r.swa_pool.allocator.free(swa)
        del self.slots[n:]
        self.lens = list(lens)

    def free(self) -> None:
        r = self.runner
        for full, swa in self.slots:
            r.full_pool.allocator.free(full)
            r.swa_pool.allocator.free(swa)
        for row in self.rows:
            r.req_to_token.free(row)


def graph_layers_ms(runner: ModelRunner, static: ForwardBatch, steps: int) -> float:
    """The trunk layers alone (no embedding, no LM head) replayed from a CUDA graph: per-layer
    efficiency with launch gaps removed, comparable with the per-layer floors."""
    llm = runner.model.model.llm
    h0 = torch.randn(static.input_ids.shape[0], runner.model.cfg.hidden_size, device=runner.device,
                     dtype=runner.dtype)  # fmt: skip

    def layers():  # as the model runs them (each layer's last launch normalises for the next)
        return llm.run_layers(h0, static)

    layers()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers()
    return statistics.median(replay_ms(graph.replay, steps))


def replay_ms(run, steps: int, refill=None) -> list[float]:
    """CUDA-event time of `run()` (a graph replay), `steps` times; `refill()` first, untimed."""
    times = []
    for _ in range(steps):
        if refill is not None:
            refill()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return times


def graph_step_ms(runner: ModelRunner, seqs: Seqs, rand_tokens, steps: int) -> tuple[list[float], float]:
    """Decode steps replayed from one CUDA graph: the captured batch's tensors are refilled per step.
    Also returns the layers-only graph time (graph_layers_ms) on the last batch."""
    static = seqs.batch(rand_tokens(1))
    graph, _ = capture_forward(runner, static)

    def refill() -> None:
        fresh = seqs.batch(rand_tokens(1))
        for name in BATCH_TENSORS:
            getattr(static, name).copy_(getattr(fresh, name))

    return replay_ms(graph.replay, steps, refill), graph_layers_ms(runner, static, steps)


def run_batch(model, cfg, bsz: int, args, gen: torch.Generator, mode: str) -> dict:
    """One batch size in one mode: `kernels` (the model as served: its Triton kernels on CUDA) or
    `eager` (the model's torch references for everything but attention)."""
    with contextlib.nullcontext() if mode == "kernels" else kernel_dispatch(False):
        result = _run_batch(model, cfg, bsz, args, gen, mode)
    gc.collect()  # the run's KV pools and CUDA graph go before the next run allocates its own
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def _run_batch(model, cfg, bsz: int, args, gen: torch.Generator, mode: str) -> dict:
    clock = Clock(model.model.llm.embed.weight.device)
    ctx = args.input_len + args.warmup_steps + 2 * args.decode_steps + 8
    runner = ModelRunner(model, bsz, ctx, bsz * ctx, attention_backend=args.attention_backend)
    probe = Probe(model, clock)

    def rand_tokens(n: int) -> list[list[int]]:
        return torch.randint(0, cfg.unpadded_vocab_size, (bsz, n), generator=gen).tolist()

    prefill_ms = []
    for rep in range(args.prefill_repeats + 1):
        seqs = Seqs(runner, bsz)
        batch = seqs.batch(rand_tokens(args.input_len))
        a = clock.mark()
        runner.forward(batch)
        b = clock.mark()
        clock.sync()
        if rep:  # the first is warm-up (kernel compilation, allocator)
            prefill_ms.append(clock.ms(a, b))
        if rep < args.prefill_repeats:
            seqs.free()

    n_layers = len(model.model.llm.layers)
    step_ms, head_ms, embed_ms = [], [], []
    layer_ms: list[list[float]] = [[] for _ in range(n_layers)]
    floors: list[list[int]] = [[] for _ in range(n_layers)]
    probe.keep_inputs = True
    for step in range(args.warmup_steps + args.decode_steps):
        batch = seqs.batch(rand_tokens(1))
        probe.reset()
        a = clock.mark()
        runner.forward(batch)
        b = clock.mark()
        clock.sync()
        if step < args.warmup_steps:
            continue
        marks = {(i, kind): m for i, kind, m in probe.marks}
        step_ms.append(clock.ms(a, b))
        embed_ms.append(clock.ms(a, marks[(0, "start")]))
        head_ms.append(clock.ms(marks[(n_layers - 1, "end")], b))
        for i, layer in enumerate(model.model.llm.layers):
            layer_ms[i].append(clock.ms(marks[(i, "start")], marks[(i, "end")]))
            floors[i].append(layer_floor_bytes(layer, cfg, seqs.lens, probe.routed_ids(model, i)))
    probe.reset()
    probe.remove()
    graph_ms, graph_error, layers_graph_ms = None, None, None
    if args.cuda_graph and mode == "kernels" and clock.cuda:
        try:
            times, layers_graph_ms = graph_step_ms(runner, seqs, rand_tokens, args.decode_steps)
            graph_ms = statistics.median(times)
        except Exception as e:  # report, keep the eager figures
            graph_error = f"{type(e).__name__}: {e}"[:500]
    seqs.free()

    llm = model.model.llm
    head_floor = to_ms(nbytes(llm.unembed) + nbytes(llm.norm) + bsz * cfg.vocab_size * 4)
    embed_floor = to_ms(bsz * cfg.hidden_size * llm.embed.weight.element_size() + nbytes(llm.embed_norm))
    layers = []
    for i in range(n_layers):
        med = statistics.median(layer_ms[i])
        floor = to_ms(int(statistics.median(floors[i])))
        kind = "sliding" if cfg.layer_types[i] == SLIDING else "full"
        layers.append({"layer": i, "kind": kind, "ms": med, "floor_ms": floor, "achieved_fraction": floor / med})
    by_kind = {k: [x for x in layers if x["kind"] == k] for k in ("sliding", "full")}

    def mean(key: str, kind: str) -> float:
        xs = by_kind[kind] or by_kind["sliding" if kind == "full" else "full"]
        return statistics.fmean(x[key] for x in xs)

    n_full = NUM_FULL_MODEL_LAYERS - NUM_FULL_MODEL_SLIDING
    head, embed = statistics.median(head_ms), statistics.median(embed_ms)
    step66 = NUM_FULL_MODEL_SLIDING * mean("ms", "sliding") + n_full * mean("ms", "full") + head + embed
    floor66 = NUM_FULL_MODEL_SLIDING * mean("floor_ms", "sliding") + n_full * mean("floor_ms", "full")
    floor66 += head_floor + embed_floor
    step_floor = sum(x["floor_ms"] for x in layers) + head_floor + embed_floor
    step = statistics.median(step_ms)
    return {
        "mode": mode,
        "batch_size": bsz,
        "input_len": args.input_len,
        "prefill_ms": statistics.median(prefill_ms),
        "prefill_tok_per_s": bsz * args.input_len / (statistics.median(prefill_ms) / 1e3),
        "decode_step_ms": step,
        "decode_step_floor_ms": step_floor,
        "decode_step_achieved_fraction": step_floor / step,
        "embed_ms": embed,
        "lm_head_ms": head,
        "lm_head_floor_ms": head_floor,
        "lm_head_achieved_fraction": head_floor / head,
        "layers": layers,
        "cuda_graph_step_ms": graph_ms,
        "cuda_graph_achieved_fraction": step_floor / graph_ms if graph_ms else None,
        "cuda_graph_error": graph_error,
        # Trunk layers alone from a CUDA graph, per layer, against the mean per-layer floor.
        "cuda_graph_layers_ms_per_layer": layers_graph_ms / n_layers if layers_graph_ms else None,
        "cuda_graph_layers_achieved_fraction": (
            sum(x["floor_ms"] for x in layers) / layers_graph_ms if layers_graph_ms else None
        ),
        "extrapolated_66_layers": {
            "step_ms": step66,
            "tok_per_s_per_user": 1e3 / step66,
            "floor_step_ms": floor66,
            "floor_tok_per_s_per_user": 1e3 / floor66,
            "cuda_graph_tok_per_s_per_user": graph_tok_per_s_66(graph_ms, layers_graph_ms, layers),
        },
    }


def graph_tok_per_s_66(graph_ms: float | None, layers_graph_ms: float | None, layers: list[dict]) -> float | None:
    """tok/s/user of plain decode at 66 layers from CUDA-graph timings: the trunk layers at their graph
    time (the eager per-kind mix of Inkling's 55 sliding and 11 full layers, scaled by the graph/eager
    ratio of the slice's layers), plus the graph step's part outside the layers (embedding, LM head).
    Scaling the whole eager step by the graph/eager step ratio instead (the formula before) charged plain
    decode its eager launch gaps per layer: 46 against 65 tok/s/user at batch 1 with NVFP4 experts, while
    the MTP figures scale graph-timed verifies, so their speed-ups read 1.4x where they were 1.1x."""
    if not graph_ms or not layers_graph_ms:
        return None
    kinds = {k: [x["ms"] for x in layers if x["kind"] == k] for k in ("sliding", "full")}
    mean = {k: sum(v) / len(v) for k, v in kinds.items() if v}
    sliding, full = mean.get("sliding", mean.get("full")), mean.get("full", mean.get("sliding"))
    trunk66 = NUM_FULL_MODEL_SLIDING * sliding + (NUM_FULL_MODEL_LAYERS - NUM_FULL_MODEL_SLIDING) * full
    return 1e3 / (trunk66 * layers_graph_ms / sum(x["ms"] for x in layers) + graph_ms - layers_graph_ms)


def git_commit() -> tuple[str, bool | None]:
    # The GPU machine gets the working tree without .git: the caller passes the commit in.
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"], None
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
        return sha.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", None


def print_table(runs: list[dict]) -> None:
    """One line per (batch size, mode); % = floor / time; graph columns only where a graph ran."""
    print(f"{'mode':>7} {'bs':>3} {'prefill ms':>10} {'step ms':>8} {'graph ms':>8} {'floor ms':>8} {'%':>4} "
          f"{'tok/s/user@66':>13} {'floor':>6}  per layer ms (floor %) | lm head ms (%)")  # fmt: skip
    for r in runs:
        e = r["extrapolated_66_layers"]
        graph = r["cuda_graph_step_ms"]
        best = graph or r["decode_step_ms"]
        tps = e["cuda_graph_tok_per_s_per_user"] or e["tok_per_s_per_user"]
        layers = " ".join(f"{x['kind'][0]}{x['ms']:.3f}({100 * x['achieved_fraction']:.0f}%)" for x in r["layers"])
        print(f"{r['mode']:>7} {r['batch_size']:>3} {r['prefill_ms']:>10.1f} {r['decode_step_ms']:>8.3f} "
              f"{(f'{graph:.3f}' if graph else '-'):>8} {r['decode_step_floor_ms']:>8.3f} "
              f"{100 * r['decode_step_floor_ms'] / best:>3.0f}% {tps:>13.1f} {e['floor_tok_per_s_per_user']:>6.1f}  "
              f"{layers} | {r['lm_head_ms']:.3f} ({100 * r['lm_head_achieved_fraction']:.0f}%)")  # fmt: skip
        if r["cuda_graph_error"]:
            print(f"        cuda graph failed: {r['cuda_graph_error']}")


def print_mtp_table(mtp: list[dict], runs: list[dict]) -> None:
    """MTP per batch size and forced acceptance length; speed-up against plain decode at 66 layers
    (both from CUDA graphs where they ran)."""
    print(f"{'bs':>3} {'accept':>6} {'verify ms':>9} {'(floor %)':>9} {'graph':>6} {'chain ms':>8} {'(floor %)':>9} "
          f"{'graph':>6} {'tok/s/user@66':>13} {'x plain':>7}")  # fmt: skip
    from benchmark.mtp_adaptive import plain_tok_per_s_66

    for m in mtp:
        base = plain_tok_per_s_66(runs, m["batch_size"])
        verify_graph = (m["verify_cuda_graph"] or {}).get("ms")
        for r in m["runs"]:
            e = r["extrapolated_66_layers"]
            tps = e.get("cuda_graph_tok_per_s_per_user") or e["tok_per_s_per_user"]
            chain_graph = (r.get("draft_chain_cuda_graph") or {}).get("ms")
            ratio = tps / base if base else float("nan")
            print(f"{m['batch_size']:>3} {r['forced_accept_length']:>6.1f} {r['verify_ms']:>9.3f} "
                  f"{100 * r['verify_floor_ms'] / r['verify_ms']:>8.0f}% {_ms(verify_graph):>6} {r['draft_chain_ms']:>8.3f} "
                  f"{100 * r['draft_chain_achieved_fraction']:>8.0f}% {_ms(chain_graph):>6} {tps:>13.1f} {ratio:>7.2f}")  # fmt: skip
            err = (r.get("draft_chain_cuda_graph") or {}).get("error") or (m["verify_cuda_graph"] or {}).get("error")
            if err:
                print(f"        graph failed: {err}")


def _ms(x: float | None) -> str:
    return f"{x:.2f}" if x else "-"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=("slice", "tiny"), default="slice")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    p.add_argument("--batch-size", type=int, nargs="+", default=[1])
    p.add_argument("--input-len", type=int, default=None)
    p.add_argument("--decode-steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--prefill-repeats", type=int, default=2)
    p.add_argument("--attention-backend", choices=("torch_native", "triton"), default=None)
    p.add_argument("--fast-path", choices=("eager", "kernels"), nargs="+", default=None,
                   help="kernels: the model as served (its Triton kernels on CUDA); eager: its torch "
                   "references for everything but attention (default on CUDA: both)")
    p.add_argument("--cuda-graph", action="store_true", help="also time decode replayed from a CUDA graph "
                   "(kernels mode only: the eager MoE syncs with the host)")
    p.add_argument("--mtp", action="store_true", help="also time MTP: the verify step and the draft chain "
                   "at forced acceptance lengths (benchmark-only switch)")
    p.add_argument("--mtp-steps", type=int, default=8)
    p.add_argument("--mtp-accept", type=float, nargs="+", default=[1.0, 2.5, 4.5, 9.0],
                   help="forced tokens per verify step (accepted drafts + 1)")
    p.add_argument("--mtp-accept-curve", type=float, nargs="+", default=list(PUBLIC_MTP8_CURVE),
                   help="benchmark-only forced acceptance for the fixed-k and adaptive MTP runs: the chance "
                   "that the first d drafts are all accepted, d = 1..K (default: the public MTP8 curve)")
    p.add_argument("--mtp-adaptive-warmup", type=int, default=100,
                   help="untimed steps in which the adaptive run learns the acceptance curve")
    p.add_argument("--mtp-adaptive-steps", type=int, default=64,
                   help="timed steps of the adaptive runs (enough that exploration shows at its share)")
    p.add_argument("--mtp-learn-steps", type=int, default=1000,
                   help="host-only steps in which the run from a flat prior learns the forced curve first")
    p.add_argument("--mtp-adaptive-only", action="store_true",
                   help="with --mtp: only the fixed k = 1..K and adaptive runs (skip the forced-length timings)")
    p.add_argument("--mtp-forced-only", action="store_true",
                   help="with --mtp: only the forced-length timings (skip the fixed k and adaptive runs)")
    p.add_argument("--mtp-draft-quantization", choices=("fp8",), default=None,
                   help="with --mtp: the depths' dense weights in fp8 (--speculative-draft-model-quantization)")
    p.add_argument("--mtp-token-map-size", type=int, default=0,
                   help="with --mtp: depths draft over this many token ids (a random draft vocabulary, as "
                   "--speculative-token-map gives; the forced acceptance makes which ids irrelevant); 0: the full vocabulary")
    p.add_argument("--load-format", choices=("dummy",), default="dummy")
    p.add_argument("--quantization", choices=NVFP4_METHODS, default=None,
                   help="routed experts in NVFP4 (random codes and scales; W4A16 kernel on CUDA); default BF16")
    p.add_argument("--moe-build", default="", help="benchmark only: the CUDA NVFP4 MoE build choices, "
                   "'field=value,...' (benchmark/moe_build.py); default: the shipped one")
    p.add_argument("--pdl", choices=("on", "off"), default="on",
                   help="benchmark only: off launches every kernel without programmatic dependencies (the before)")
    p.add_argument("--projections", choices=("gemv", "cublas"), default="gemv",
                   help="benchmark only: cublas runs a decode step's q/k/v/r and output projections in F.linear "
                   "(the before of dense_gemv)")
    p.add_argument("--gemv-tiles", default="", help="benchmark only: dense_gemv's tiles as "
                   "'block_n,block_k,pre_k,num_stages,num_warps'; default: the shipped ones")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", type=Path, default=None)
    args = p.parse_args(argv)
    if args.mtp_draft_quantization and not args.mtp:
        p.error("--mtp-draft-quantization needs --mtp (only the MTP depths are quantized)")
    with contextlib.ExitStack() as stack:
        if args.pdl == "off":
            stack.enter_context(no_pdl())
        if args.projections == "cublas":
            stack.enter_context(cublas_projections())
        if args.gemv_tiles:
            stack.enter_context(gemv_tiles(GemvTiles.parse(args.gemv_tiles)))
        return _main(args)


def draft_token_map(cfg, size: int) -> torch.Tensor | None:
    """A benchmark's draft vocabulary: `size` random token ids, sorted (None for size 0: the full
    vocabulary). Forced acceptance makes which ids irrelevant; their number sets the depths' cost."""
    if not size:
        return None
    ids = torch.randperm(cfg.unpadded_vocab_size, generator=torch.Generator().manual_seed(1))
    return ids[:size].sort().values


def _main(args: argparse.Namespace) -> dict:
    moe_build = dataclasses.asdict(apply_moe_build(args.moe_build))
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    args.attention_backend = args.attention_backend or ("triton" if cuda else "torch_native")
    args.input_len = args.input_len or (1024 if args.config == "slice" else 40)
    config = slice_config() if args.config == "slice" else InklingConfig.from_dict(TINY_CONFIG)
    expert_quant = resolve_quantization(args.quantization, None, "dummy")
    config = with_expert_quant(config, expert_quant)
    name = ("inkling-slice" if args.config == "slice" else "inkling-tiny") + ("-nvfp4" if expert_quant else "")

    t0 = time.perf_counter()
    model = build_model(config, dtype, device)
    init_dummy_weights(model, seed=args.seed)
    quantize_drafts(model, args.mtp_draft_quantization)
    Clock(device).sync()
    print(f"{name}: built {nbytes(model) / 1e9:.1f} GB of dummy weights on {device} in {time.perf_counter() - t0:.1f} s")
    gen = torch.Generator().manual_seed(args.seed)
    modes = args.fast_path or (["eager", "kernels"] if cuda else ["eager"])
    runs = [run_batch(model, config.text, bsz, args, gen, m) for bsz in args.batch_size for m in modes]
    mtp = adaptive = None
    if args.mtp:
        from benchmark import mtp_adaptive, mtp_timing

        if not args.mtp_adaptive_only:
            mtp = [mtp_timing.run_mtp(model, config.text, bsz, args, gen, sys.modules[__name__])
                   for bsz in args.batch_size]  # fmt: skip
        if not args.mtp_forced_only:
            adaptive = [mtp_adaptive.run_adaptive(model, config.text, bsz, args, gen, sys.modules[__name__])
                        for bsz in args.batch_size]  # fmt: skip
            adaptive = [m for m in adaptive if m is not None]  # batches whose MTP graphs did not fit

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    commit, dirty = git_commit()
    result = {
        "benchmark": "bench_one_batch",
        "config": name,
        "text_config": config.raw.get("text_config"),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "dtype": str(dtype).removeprefix("torch."),
        "attention_backend": args.attention_backend,
        "cuda_graph": bool(args.cuda_graph),
        "load_format": args.load_format,
        "routed_experts": expert_quant or str(dtype).removeprefix("torch."),
        "moe_cuda_build": moe_build if expert_quant else None,
        "pdl": args.pdl,
        "projections": args.projections,
        "gemv_tiles": dataclasses.asdict(dense_gemv.TILES),
        "bandwidth_bytes_per_s": peak_tb_s() * 1e12,
        "decode_steps": args.decode_steps,
        "warmup_steps": args.warmup_steps,
        "runs": runs,
        "mtp_token_map_size": args.mtp_token_map_size or None,
        "mtp_draft_quantization": args.mtp_draft_quantization,
        "mtp": mtp,
        "mtp_adaptive": adaptive,
    }
    out = args.result_file or ROOT / "benchmark" / "results" / (
        f"bench_one_batch_{name}_{args.device.replace(':', '')}_{result['timestamp'].replace(':', '')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print_table(runs)
    if mtp:
        print_mtp_table(mtp, runs)
    if adaptive:
        mtp_adaptive.print_adaptive_table(adaptive, runs)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
