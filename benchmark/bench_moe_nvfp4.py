"""The fused NVFP4 MoE (routed W4A16 + BF16 sinks) at Inkling's width on one GPU, against its bandwidth floor.

At each batch size, random routing (top-k of distinct experts per token, a fresh routing for each
of the calls captured in one CUDA graph, so the L2 never holds the next call's experts) and
random codes and scales (never zero). Timed: graph replay with CUDA events after warm-up, the
median over replays divided by the calls per graph. Bytes are those that must stream: 0.5625 per
routed weight of the distinct experts a call hits (codes + fp8 block scales) plus the BF16 sinks;
TB/s and the fraction of the card's ceiling follow (benchmark/hbm_ceiling.py: 4.3 TB/s on the H200). For "what limits it" the run also times the routed part
alone (no sinks), the sinks alone (every routed id foreign), and the BF16 fused_moe on the same
routing with the dequantized experts (which also checks that the two agree).

    python benchmark/bench_moe_nvfp4.py --result-file out.json [--tiles default mma g:1,16,32,8,8,4,8@1 ...] [--asm 1 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "python")]

from benchmark.bench_one_batch import git_commit  # noqa: E402
from benchmark.hbm_ceiling import peak_tb_s  # noqa: E402
from sgl_inkling_kernels.fused_moe import fused_moe  # noqa: E402
from sgl_inkling_kernels.fused_moe_nvfp4 import Tiles, fused_moe_nvfp4  # noqa: E402
from sgl_inkling_kernels.moe_nvfp4_gemv import GemvTiles  # noqa: E402
from sgl_inkling_kernels.moe_w4a16_cuda import SINK_PATHS, CudaTiles, set_sink_path  # noqa: E402
from sgl_inkling_kernels.nvfp4 import dequantize_nvfp4  # noqa: E402
from sgl_inkling_kernels.nvfp4_layout import to_mma_layout  # noqa: E402


def quantized(e, rows, cols, gen):
    codes = torch.randint(0, 256, (e, rows, cols // 2), generator=gen, device="cuda", dtype=torch.uint8)
    scale = (torch.rand(e, rows, cols // 16, generator=gen, device="cuda") * 1.5 + 0.25).to(torch.float8_e4m3fn)
    scale2 = torch.full((e,), cols**-0.5 / 3, device="cuda")
    return codes, scale, scale2


def time_graph(fn, calls: int, replays: int) -> float:
    """Median ms per call of `calls` back-to-back calls captured in one graph."""
    for c in range(calls):
        fn(c)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        for c in range(calls):
            fn(c)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def copy_tbs() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written: the ceiling as this card is found."""
    src = torch.randn(2**30, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = time_graph(lambda _c: dst.copy_(src), 4, 10)
    return 2 * src.numel() * 2 / ms / 1e9


def read_tbs() -> float:
    """A batch-1 BF16 linear over 1 GiB of weights (cuBLAS): the read bandwidth a weight stream can get."""
    w = torch.randn(65536, 8192, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(1, 8192, dtype=torch.bfloat16, device="cuda")
    ms = time_graph(lambda _c: x @ w.t(), 4, 10)
    return w.numel() * 2 / ms / 1e9


CUDA_FIELDS = [f.name for f in dataclasses.fields(CudaTiles)]
CUDA_SPEC = "c:" + ",".join(CUDA_FIELDS)
# A c: spec names every CudaTiles field, so that a spec written for another field list fails instead
# of shifting its values into other fields. Until lean was added after row_ring a spec had 13 fields,
# until row_tiles after lean 14. Older 15-field specs had bulk (before it, persist) as the 13th and lean
# last, removed since: read now, their row_ring lands in lean, which CudaTiles refuses unless it is 0 or 1.
_OLD_LENGTHS = {13: "lean (the 14th field) was added after row_ring: append 0,1 for the same build",
                14: "row_tiles (the 15th field) was added after lean: append 1 for the same launches"}


def cuda_tiles(body: str) -> CudaTiles:
    fields = [int(f) for f in body.split(",")]
    if len(fields) != len(CUDA_FIELDS):
        why = _OLD_LENGTHS.get(len(fields), "")
        raise SystemExit(f"--tiles c:{body}: {len(fields)} fields, a c: spec has all {len(CUDA_FIELDS)} of "
                         f"{CUDA_SPEC}{f' ({why})' if why else ''}")  # fmt: skip
    try:
        return CudaTiles(*fields)
    except ValueError as exc:
        raise SystemExit(f"--tiles c:{body}: {exc}") from None


def parse_tiles(spec: str | None):
    """(tiles, asm choices, batch sizes) of a --tiles entry: "default" (the module's dispatch), "mma"
    (the MMA kernels' defaults), "m:up_n,down_n,kb,bk_sink,warps,stages[,asm]" (MMA), or
    "g:bm,up_n,down_n,kw,kw_sink,warps,sink_max" (small-M GEMVs), or CUDA_SPEC (the CUDA decode
    kernels, every field); "@1,8" after it: only at those batches."""
    spec = spec or "default"
    spec, _, at = spec.partition("@")
    batches = [int(b) for b in at.split(",")] if at else []
    if spec == "default":
        return None, [], batches
    if spec == "mma":
        return Tiles(), [], batches
    kind, _, body = spec.partition(":")
    fields = [int(f) for f in body.split(",")]
    if kind == "g":
        return GemvTiles(*fields), [], batches
    if kind == "c":
        return cuda_tiles(body), [], batches
    return Tiles(*fields[:6]), fields[6:], batches  # a 7th field picks the decode for this variant


def tiles_doc(tiles) -> dict:
    if tiles is None:
        return {"path": "default dispatch"}
    path = "gemv" if isinstance(tiles, GemvTiles) else "cuda" if isinstance(tiles, CudaTiles) else "mma"
    return {"path": path, **tiles.__dict__}


def run_variant(args, tiles, asm, xs, idss, wts, gam, foreign, ws, sw13, sw2, bf13, bf2) -> dict:
    """ms per call: routed + sinks, routed alone, sinks alone (every routed id foreign); the error vs BF16.
    ws: the routed experts per code layout; the GEMVs read the checkpoint's, the rest the mma layout
    (what serving holds on the GPU)."""
    layout = "checkpoint" if isinstance(tiles, GemvTiles) else "mma"
    w13, w2 = ws[layout]
    kw = dict(tiles=tiles, asm=asm, layout=layout)

    def full(c):
        return fused_moe_nvfp4(xs[c], *w13, *w2, idss[c], wts[c], sw13, sw2, gam, **kw)

    v = {"tiles": tiles_doc(tiles), "asm": asm}
    if bf13 is not None:  # first, so that a wrong variant is seen as wrong before it is timed
        got, want = full(0).float(), fused_moe(xs[0], bf13, bf2, idss[0], wts[0], sw13, sw2, gam).float()
        v["rel_err_vs_bf16_fused_moe"] = float((got - want).norm() / want.norm())
    v["ms"] = time_graph(full, args.calls, args.replays)
    v["routed_only_ms"] = time_graph(lambda c: fused_moe_nvfp4(xs[c], *w13, *w2, idss[c], wts[c], **kw),
                                     args.calls, args.replays)  # fmt: skip
    v["sinks_only_ms"] = time_graph(lambda c: fused_moe_nvfp4(xs[c], *w13, *w2, foreign, wts[c], sw13, sw2, gam,
                                                              foreign_ids=True, **kw), args.calls, args.replays)  # fmt: skip
    return v


def run_batch(args, bs, gen, ws, sw13, sw2, bf13, bf2) -> dict:
    """Every tile variant at one batch size, plus the BF16 fused_moe on the same routing."""
    h, i, n_exp, k, n_s = args.hidden, args.inter, args.experts, args.top_k, args.sinks
    routed_bytes = 3 * h * i * (0.5 + 1 / 16)  # per distinct expert: codes + block scales
    sink_bytes = n_s * 3 * h * i * 2
    xs = [torch.randn(bs, h, generator=gen, device="cuda").bfloat16() for _ in range(args.calls)]
    idss = [torch.rand(bs, n_exp, generator=gen, device="cuda").topk(k, dim=1).indices for _ in range(args.calls)]
    wts = [(torch.rand(bs, k, generator=gen, device="cuda") + 0.5).bfloat16() for _ in range(args.calls)]
    gam = (torch.rand(bs, n_s, generator=gen, device="cuda") + 0.5).bfloat16()
    foreign = torch.full((bs, k), n_exp, dtype=torch.int64, device="cuda")
    hit = statistics.mean(torch.unique(ids).numel() for ids in idss)
    moe_bytes = hit * routed_bytes + sink_bytes
    row = {"batch_size": bs, "distinct_experts_per_call": hit, "bytes_routed_plus_sinks": moe_bytes, "variants": []}
    for spec in args.tiles:
        tiles, asms, batches = parse_tiles(spec)
        if batches and bs not in batches:
            continue
        for asm in asms or args.asm:
            try:
                v = run_variant(args, tiles, bool(asm), xs, idss, wts, gam, foreign, ws, sw13, sw2, bf13, bf2)
            except Exception as exc:  # a variant that does not compile must not lose the others
                print(f"bs {bs:3d} {spec or 'default'} asm={asm}: FAILED {exc!r}"[:2000], flush=True)
                row["variants"].append({"tiles": tiles_doc(tiles), "asm": bool(asm), "error": repr(exc)[:2000]})
                continue
            v["tb_s"] = moe_bytes / v["ms"] / 1e9
            v["fraction_of_peak"] = v["tb_s"] / peak_tb_s()
            v["routed_only_tb_s"] = hit * routed_bytes / v["routed_only_ms"] / 1e9
            v["sinks_only_tb_s"] = sink_bytes / v["sinks_only_ms"] / 1e9
            row["variants"].append(v)
            print(f"bs {bs:3d} {spec or 'default'} asm={asm}: {v['ms'] * 1e3:7.1f} us {v['tb_s']:.2f} TB/s "
                  f"({v['fraction_of_peak']:.0%}); routed {v['routed_only_ms'] * 1e3:.1f} us "
                  f"{v['routed_only_tb_s']:.2f} TB/s; sinks {v['sinks_only_ms'] * 1e3:.1f} us "
                  f"{v['sinks_only_tb_s']:.2f} TB/s; rel err {v.get('rel_err_vs_bf16_fused_moe')}", flush=True)  # fmt: skip
    if bf13 is not None:
        ms_bf = time_graph(lambda c: fused_moe(xs[c], bf13, bf2, idss[c], wts[c], sw13, sw2, gam),
                           args.calls, args.replays)  # fmt: skip
        bf_bytes = hit * 3 * h * i * 2 + sink_bytes
        row["bf16_fused_moe"] = {"ms": ms_bf, "bytes": bf_bytes, "tb_s": bf_bytes / ms_bf / 1e9,
                                 "fraction_of_peak": bf_bytes / ms_bf / 1e9 / peak_tb_s()}  # fmt: skip
    timed = [v for v in row["variants"] if "ms" in v]
    best = min(timed, key=lambda v: v["ms"]) if timed else None
    row["best"] = best and {k: best[k] for k in ("tiles", "asm", "ms", "tb_s", "fraction_of_peak")}
    return row


def kernel_stats(dump: Path | None) -> list:
    """Registers, spills and shared memory of every compiled variant (and its PTX under `dump`)."""
    from sgl_inkling_kernels import fused_moe_nvfp4 as mod
    from sgl_inkling_kernels import moe_nvfp4_gemv as gv

    out = []
    for fn in (mod._up_kernel, mod._down_kernel, gv._up_gemv_kernel, gv._down_gemv_kernel):
        try:
            for entry in fn.device_caches.values():
                for n, (key, kern) in enumerate(entry[0].items()):
                    out.append({"kernel": fn.__name__, "n_regs": kern.n_regs, "n_spills": kern.n_spills,
                                "shared": kern.metadata.shared, "key": str(key)[:400]})  # fmt: skip
                    if dump is not None and n == 0:
                        (dump / f"{fn.__name__}.ptx").write_text(kern.asm["ptx"])
        except Exception as exc:  # internals differ between Triton versions: report, do not fail
            out.append({"kernel": fn.__name__, "error": repr(exc)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=6144)
    p.add_argument("--inter", type=int, default=3072)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--top-k", type=int, default=6)
    p.add_argument("--sinks", type=int, default=2)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    p.add_argument("--tiles", nargs="+", default=[None], help="default | mma | m:up_n,down_n,kb,bk_sink,warps,stages[,asm] | g:bm,up_n,down_n,kw,kw_sink,warps,sink_max | "
                   f"{CUDA_SPEC}, each optionally @batch,batch")
    p.add_argument("--asm", type=int, nargs="+", default=[1], help="1: PTX bf16 decode, 0: portable decode")
    p.add_argument("--calls", type=int, default=8, help="MoE calls (fresh routings) per captured graph")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--no-bf16", action="store_true", help="skip the BF16 fused_moe comparison (29 GB of weights)")
    p.add_argument("--sink-path", choices=SINK_PATHS, default="gemv",
                   help="the BF16 sinks beside the routed CUDA kernels: the Triton GEMVs (default) or cuBLAS")
    p.add_argument("--sink-gemv-stages", type=int, default=3, help="the sinks' GEMV pipeline stages")
    p.add_argument("--sink-gemv-blocks", type=int, nargs=2, default=[16, 32], metavar=("J", "N"),
                   help="the sinks' GEMV row bands: gate/up J, down N")
    p.add_argument("--result-file", type=Path, required=True)
    p.add_argument("--dump-dir", type=Path, default=None, help="write the first variant's PTX here")
    args = p.parse_args()
    set_sink_path(args.sink_path, gemv_stages=args.sink_gemv_stages,
                  gemv_blocks=tuple(args.sink_gemv_blocks))
    h, i, n_exp, k, n_s = args.hidden, args.inter, args.experts, args.top_k, args.sinks
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13, w2 = quantized(n_exp, 2 * i, h, gen), quantized(n_exp, h, i, gen)
    sw13 = (torch.randn(n_s, 2 * i, h, generator=gen, device="cuda") * h**-0.5).bfloat16()
    sw2 = (torch.randn(n_s, h, i, generator=gen, device="cuda") * i**-0.5).bfloat16()
    ceiling, read_ceiling = copy_tbs(), read_tbs()
    print(f"copy ceiling {ceiling:.2f} TB/s, bf16 linear (read) {read_ceiling:.2f} TB/s, peak {peak_tb_s():.2f} TB/s", flush=True)
    bf13 = bf2 = None
    if not args.no_bf16:  # the same experts dequantized to BF16, for the comparison and the check
        bf13 = torch.empty(n_exp, 2 * i, h, dtype=torch.bfloat16, device="cuda")
        bf2 = torch.empty(n_exp, h, i, dtype=torch.bfloat16, device="cuda")
        for a in range(0, n_exp, 16):
            sl = slice(a, a + 16)
            bf13[sl] = dequantize_nvfp4(w13[0][sl], w13[1][sl], w13[2][sl], torch.bfloat16)
            bf2[sl] = dequantize_nvfp4(w2[0][sl], w2[1][sl], w2[2][sl], torch.bfloat16)
    ws = {"checkpoint": (w13, w2), "mma": tuple((to_mma_layout(w[0]), *w[1:]) for w in (w13, w2))}
    results = [run_batch(args, bs, gen, ws, sw13, sw2, bf13, bf2) for bs in args.batch_sizes]
    import triton

    commit, dirty = git_commit()
    doc = {
        "benchmark": "bench_moe_nvfp4",
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {"hidden": h, "inter": i, "experts": n_exp, "top_k": k, "sinks": n_s, "calls_per_graph": args.calls,
                   "replays": args.replays, "dtype": "bfloat16", "peak_tb_s": peak_tb_s()},
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "copy_ceiling_tb_s": ceiling,
        "bf16_linear_read_tb_s": read_ceiling,
        "results": results,
        # What "default dispatch" ran: the shipped CudaTiles (default builds change between commits).
        "default_build": tiles_doc(CudaTiles()),
        "sink_path": args.sink_path,
        "sink_plan": {"gemv_stages": args.sink_gemv_stages,
                      "gemv_blocks": args.sink_gemv_blocks},
        "kernels": kernel_stats(args.dump_dir),
    }  # fmt: skip
    args.result_file.parent.mkdir(parents=True, exist_ok=True)
    args.result_file.write_text(json.dumps(doc, indent=1))
    print(f"\n{'bs':>3} {'hit':>5} {'MB':>6} {'best us':>8} {'TB/s':>5} {'of peak':>7} {'bf16 us':>8} {'bf16 TB/s':>9}  best tiles")
    for r in results:
        b, bf = r["best"], r.get("bf16_fused_moe", {})
        if b is None:
            print(f"{r['batch_size']:3d}  every variant failed")
            continue
        print(f"{r['batch_size']:3d} {r['distinct_experts_per_call']:5.1f} {r['bytes_routed_plus_sinks'] / 1e6:6.0f} "
              f"{b['ms'] * 1e3:8.1f} {b['fraction_of_peak'] * peak_tb_s():5.2f} {b['fraction_of_peak']:7.1%} "
              f"{bf.get('ms', float('nan')) * 1e3:8.1f} {bf.get('tb_s', float('nan')):9.2f}  {b['tiles']} asm={b['asm']}")  # fmt: skip


if __name__ == "__main__":
    main()
