"""The small decode ops of one Inkling layer at full width, fused (the current kernels) and unfused
(the launches they replaced), each against its bandwidth floor: bytes that must move / the card's
ceiling (benchmark/hbm_ceiling.py: 4.3 TB/s on the H200).

    python benchmark/bench_decode_ops.py --batch-sizes 1 64 --result-file benchmark/results/bench_decode_ops.json
    python benchmark/bench_decode_ops.py --batch-sizes 1 8 16 ...  # router_align: one launch possible up to batch 10
    python benchmark/bench_decode_ops.py --ops router_align --batch-sizes 11 16 32 64 85  # moe_align's sort vs torch

Ops: q/k/v/r projection with its convs, norms and KV cache store (full and sliding layers), attention-output conv +
residual + norm, FFN-output conv + residual, router (fp32 GEMM + top-k + sink weights), router_align (the router
and the experts' pair layout, router_align_case), and decode
attention at 8K and 128K contexts (full layer) and the 512 window (sliding). "two_launch" (attention):
the merge in a second launch, as before the last split program of a group could merge it (`arrivals`).
Each call of a graph
gets its own inputs (weights too where they fit the 50 MB L2 many times over), so nothing is
served from the L2 that a real step would stream. Timed with `bench_moe_nvfp4.time_graph`.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "python")]

from benchmark.bench_moe_nvfp4 import time_graph  # noqa: E402
from benchmark.bench_one_batch import git_commit  # noqa: E402
from benchmark.hbm_ceiling import peak_tb_s  # noqa: E402
from sgl_inkling_kernels.decode_attention import decode_attention, default_num_splits  # noqa: E402
from sgl_inkling_kernels.fused_moe import (  # noqa: E402
    SMALL_ALIGN_PAIRS,
    SORT_ALIGN_PAIRS,
    _moe_align_torch,
    align_blocks,
    moe_align,
)
from sgl_inkling_kernels.moe_slots import UnsummedSlots, sum_slots  # noqa: E402
from sgl_inkling_kernels.moe_w4a16_cuda import cuda_block_m  # noqa: E402
from sgl_inkling_kernels.qkvr_epilogue import qkvr_decode_epilogue  # noqa: E402
from sgl_inkling_kernels.rmsnorm import fused_add_rmsnorm, rmsnorm  # noqa: E402
from sgl_inkling_kernels.router import route, route_decode, route_decode_aligned  # noqa: E402
from sgl_inkling_kernels.sconv import sconv_decode  # noqa: E402
from sgl_inkling_kernels.sconv_norm import sconv_add_decode, sconv_add_rmsnorm_decode  # noqa: E402

H, NH, HD, DREL, E, S, TOPK = 6144, 64, 128, 16, 256, 2, 6
BF = torch.bfloat16


def rnd(*shape, dtype=BF, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def qkvr_case(bsz: int, nkv: int, calls: int):
    kv = nkv * HD
    rows = NH * HD + 2 * kv + NH * DREL
    w = rnd(rows, H, scale=0.02)  # 163 MB or more: streams from HBM every call
    parts = w.split([NH * HD, kv, kv, NH * DREL])
    sets = [dict(x=rnd(bsz, H), ks=rnd(bsz, 3, kv, dtype=torch.float32), vs=rnd(bsz, 3, kv, dtype=torch.float32))
            for _ in range(calls)]  # fmt: skip
    qn, kn = rnd(HD), rnd(HD)
    kc, vc = rnd(kv, 1, 4, dtype=torch.float32, scale=0.1), rnd(kv, 1, 4, dtype=torch.float32, scale=0.1)
    idx = torch.arange(bsz, device="cuda")
    k_buf, v_buf = rnd(4 * bsz, nkv, HD), rnd(4 * bsz, nkv, HD)  # the KV cache the new k / v go to
    loc = torch.randperm(4 * bsz, device="cuda")[:bsz]

    def fused(c):
        d = sets[c]
        qkvr_decode_epilogue(d["x"] @ w.t(), NH, nkv, HD, qn, kn, kc, vc, d["ks"], d["vs"], idx, 1e-6,
                             kv_cache=(k_buf, v_buf, loc))  # fmt: skip

    def unfused(c):
        d = sets[c]
        x = d["x"]
        rmsnorm((x @ parts[0].t()).view(bsz, NH, HD), qn, 1e-6)
        k_buf[loc] = rmsnorm(sconv_decode(x @ parts[1].t(), kc, d["ks"], idx).view(bsz, nkv, HD), kn, 1e-6)
        v_buf[loc] = sconv_decode(x @ parts[2].t(), vc, d["vs"], idx).view(bsz, nkv, HD)
        x @ parts[3].t()

    moved = w.numel() * 2 + bsz * (H * 2 + rows * 2 + 2 * kv * 4 * 3 * 2) + 2 * kv * 4 * 4
    return fused, unfused, moved


def conv_norm_case(bsz: int, calls: int, norm: bool):
    sets = [dict(a=rnd(bsz, H), h=rnd(bsz, H), st=rnd(bsz, 3, H, dtype=torch.float32)) for _ in range(calls)]
    conv, nw = rnd(H, 1, 4, dtype=torch.float32, scale=0.1), rnd(H)
    idx = torch.arange(bsz, device="cuda")

    def fused(c):
        d = sets[c]
        if norm:
            sconv_add_rmsnorm_decode(d["a"], conv, d["st"], idx, d["h"], nw, 1e-6)
        else:
            sconv_add_decode(d["a"], conv, d["st"], idx, d["h"])

    def unfused(c):
        d = sets[c]
        y = sconv_decode(d["a"], conv, d["st"], idx)
        if norm:
            fused_add_rmsnorm(y, d["h"], nw, 1e-6)
        else:
            d["h"] + y

    moved = bsz * H * 2 * (3 + norm) + bsz * 3 * H * 4 * 2 + H * 4 * 4 + norm * H * 2
    return fused, unfused, moved


def conv_slots_case(bsz: int, calls: int):
    """The FFN output conv + residual add reading the NVFP4 MoE's unsummed slots (fused: summed in the
    conv's launch, as the model does up to SLOT_SUM_IN_CONV_MAX_TOKENS tokens) against sum_slots' own
    launch and the conv (unfused); one routed slot in 6 foreign."""
    n_slots = TOPK + S
    ids = torch.randint(0, E, (bsz, TOPK), device="cuda")
    ids[:, 0] = torch.where(torch.arange(bsz, device="cuda") % 6 == 0, E, ids[:, 0])
    sets = [dict(s=UnsummedSlots(rnd(bsz, n_slots, H, dtype=torch.float32), ids, E, BF), h=rnd(bsz, H),
                 st=rnd(bsz, 3, H, dtype=torch.float32)) for _ in range(calls)]  # fmt: skip
    conv = rnd(H, 1, 4, dtype=torch.float32, scale=0.1)
    idx = torch.arange(bsz, device="cuda")

    def fused(c):
        d = sets[c]
        sconv_add_decode(d["s"], conv, d["st"], idx, d["h"])

    def unfused(c):
        d = sets[c]
        sconv_add_decode(sum_slots(d["s"]), conv, d["st"], idx, d["h"])

    moved = bsz * n_slots * H * 4 + bsz * H * 2 * 2 + bsz * 3 * H * 4 * 2 + H * 4 * 4
    return fused, unfused, moved


def router_case(bsz: int, calls: int):
    sets = [dict(x=rnd(bsz, H), w=rnd(E + S, H, dtype=torch.float32, scale=0.02)) for _ in range(calls)]
    bias, gs = rnd(E, dtype=torch.float32, scale=0.1), torch.ones(1, device="cuda")

    def fused(c):
        d = sets[c]
        route_decode(d["x"], d["w"], bias, gs, TOPK, 8.0)

    def unfused(c):
        d = sets[c]
        route(d["x"].float() @ d["w"].t(), bias, gs, TOPK, 8.0, BF)

    return fused, unfused, (E + S) * H * 4 + bsz * H * 2


def router_align_case(bsz: int, calls: int):
    """The router and the experts' pair layout (moe_align at the CUDA decode kernels' block size): made in
    the routing launch (fused: route_decode_aligned, which takes at most SMALL_ALIGN_PAIRS pairs; the model
    takes it up to ALIGNED_ROUTER_MAX_TOKENS tokens) against routing and moe_align in launches of their own
    (unfused). Past SMALL_ALIGN_PAIRS pairs, up to SORT_ALIGN_PAIRS (batch 85), the routing launch and
    moe_align's one sorting program (fused) against the routing launch and moe_align's torch launches
    (unfused); past that only the latter runs, timed as fused."""
    sets = [dict(x=rnd(bsz, H), w=rnd(E + S, H, dtype=torch.float32, scale=0.02)) for _ in range(calls)]
    bias, gs = rnd(E, dtype=torch.float32, scale=0.1), torch.ones(1, device="cuda")
    block_m = cuda_block_m(bsz * TOPK, E, bsz)
    n_pairs = bsz * TOPK

    def aligned(c):
        d = sets[c]
        route_decode_aligned(d["x"], d["w"], bias, gs, TOPK, 8.0, block_m)

    def separate(c):
        d = sets[c]
        moe_align(route_decode(d["x"], d["w"], bias, gs, TOPK, 8.0)[0], E, block_m)

    def separate_torch(c):
        d = sets[c]
        ids = route_decode(d["x"], d["w"], bias, gs, TOPK, 8.0)[0]
        _moe_align_torch(ids.reshape(-1), E, block_m, align_blocks(n_pairs, E, block_m))

    moved = (E + S) * H * 4 + bsz * H * 2
    if n_pairs <= SMALL_ALIGN_PAIRS:
        return aligned, separate, moved
    if n_pairs <= SORT_ALIGN_PAIRS:
        return separate, separate_torch, moved
    return separate, None, moved


def attention_case(bsz: int, calls: int, ctx: int, nkv: int, window: int | None, coverage: int = 8,
                   launch: tuple[int, int, int] = (64, 4, 2)):  # fmt: skip
    """launch: the split kernel's (block_n, num_warps, num_stages)."""
    block_n, warps, stages = launch
    slots = bsz * ctx + 1
    k_buf, v_buf = rnd(slots, nkv, HD), rnd(slots, nkv, HD)  # every sequence its own keys
    table = (1 + torch.arange(bsz * ctx, device="cuda")).view(bsz, ctx)
    pos = torch.full((bsz,), ctx - 1, device="cuda")
    rows = torch.arange(bsz, device="cuda")
    rel_table = rnd(DREL, window or 1024)
    sets = [dict(q=rnd(bsz, NH, HD), rel=rnd(bsz, NH, DREL)) for _ in range(calls)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = default_num_splits(bsz, nkv, window or ctx, block_n, sms, coverage)

    def run(c, merge_in_kernel=True):
        d = sets[c]
        decode_attention(d["q"], k_buf, v_buf, table, rows, pos, d["rel"], rel_table, None, 1 / HD, window,
                         num_splits=splits, block_n=block_n, num_warps=warps, num_stages=stages,
                         merge_in_kernel=merge_in_kernel)  # fmt: skip

    keys = min(ctx, window or ctx)
    moved = bsz * keys * nkv * HD * 2 * 2 + bsz * NH * (HD + DREL) * 2 * 2
    return run, None, moved, partial(run, merge_in_kernel=False)  # two launches: the merge its own


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    p.add_argument("--calls", type=int, default=16)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--split-coverage", type=int, nargs="*", default=[],
                   help="also time decode attention with splits covering the SMs this many times (default 8)")
    p.add_argument("--result-file", type=Path, default=ROOT / "benchmark/results/bench_decode_ops_inkling.json")
    p.add_argument("--ops", nargs="*", default=[], help="only these ops (names as in the JSON; default all)")
    p.add_argument("--attn-launches", nargs="*", default=[], metavar="BN,WARPS,STAGES",
                   help="also time decode attention (8K full, 1K full, 512 window) with these split-kernel launches")
    args = p.parse_args()
    results = []
    for bsz in args.batch_sizes:
        cases = {  # built only when run: --ops skips the others' buffers
            "qkvr_full": partial(qkvr_case, bsz, 8, args.calls),
            "qkvr_sliding": partial(qkvr_case, bsz, 16, args.calls),
            "attn_conv_add_norm": partial(conv_norm_case, bsz, args.calls, norm=True),
            "ffn_conv_add": partial(conv_norm_case, bsz, args.calls, norm=False),
            "ffn_conv_add_slots": partial(conv_slots_case, bsz, args.calls),
            "router": partial(router_case, bsz, args.calls),
            "router_align": partial(router_align_case, bsz, args.calls),
            "attention_full_8k": partial(attention_case, bsz, 2, 8192, 8, None),
            "attention_sliding_512": partial(attention_case, bsz, 2, 8192, 16, 512),
        }
        if bsz == 1:
            cases["attention_full_128k"] = partial(attention_case, bsz, 2, 131072, 8, None)
        for spec in args.attn_launches:
            launch = tuple(int(v) for v in spec.split(","))
            cases[f"attention_full_8k@{spec}"] = partial(attention_case, bsz, 2, 8192, 8, None, 8, launch)
            cases[f"attention_full_1k@{spec}"] = partial(attention_case, bsz, 2, 1024, 8, None, 8, launch)
            cases[f"attention_sliding_512@{spec}"] = partial(attention_case, bsz, 2, 8192, 16, 512, 8, launch)
        for cov in args.split_coverage:
            cases[f"attention_full_8k@cov{cov}"] = partial(attention_case, bsz, 2, 8192, 8, None, cov)
            cases[f"attention_sliding_512@cov{cov}"] = partial(attention_case, bsz, 2, 8192, 16, 512, cov)
        for name, case in cases.items():
            if args.ops and name not in args.ops:
                continue
            fused, unfused, moved, *two_launch = case()  # two_launch: the fused op before arrivals
            calls = args.calls if name[:9] != "attention" else 2
            floor_us = moved / (peak_tb_s() * 1e12) * 1e6
            row = {"batch_size": bsz, "op": name, "bytes": moved, "floor_us": floor_us}
            two = two_launch[0] if two_launch else None
            for label, fn in (("fused", fused), ("unfused", unfused), ("two_launch", two)):
                if fn is not None:
                    us = time_graph(fn, calls, args.replays) * 1e3
                    row[f"{label}_us"], row[f"{label}_floor_fraction"] = us, floor_us / us
            results.append(row)
            print(f"bs {bsz:3d} {name:24s} floor {floor_us:7.2f} us  fused {row['fused_us']:7.2f} us "
                  f"({row['fused_floor_fraction']:5.1%})" + (f"  unfused {row['unfused_us']:7.2f} us "
                  f"({row['unfused_floor_fraction']:5.1%})" if "unfused_us" in row else "")
                  + (f"  two launches {row['two_launch_us']:7.2f} us" if "two_launch_us" in row else ""))  # fmt: skip
    import triton

    commit, dirty = git_commit()
    doc = {"benchmark": "bench_decode_ops", "config": {"hidden": H, "heads": NH, "head_dim": HD, "d_rel": DREL,
           "experts": E, "sinks": S, "top_k": TOPK, "peak_tb_s": peak_tb_s(), "calls_per_graph": args.calls},
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "git_commit": commit, "git_dirty": dirty, "results": results}  # fmt: skip
    args.result_file.parent.mkdir(parents=True, exist_ok=True)
    args.result_file.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
