"""The BF16 sink experts of one MoE layer (Inkling width: 2 sinks, H 6144, I 3072) through cuBLAS in
several forms and through this project's Triton GEMVs, against the bandwidth floor of their 226 MB.
The fused NVFP4 MoE runs them on a side stream beside the routed launches (gemv_16x32, with 3 stages
there, up to 64 tokens: moe_w4a16_cuda.SinkPlan); at batch 1 they are over half the layer's MoE bytes, so how close to
the floor they stream bounds the whole MoE.

Forms (each checked against the first):
  bmm:       today's sinks_blas: a broadcast matmul [S, T, 2I] and a bmm for the down projections;
  gemv_JxN:  sink_gemv.sinks_gemv, two Triton launches (bands of J activation rows / N down rows);
  cat_up:    both sinks' gate/up rows as one [S * 2I, H] linear, then the same bmm;
  cat_both:  cat_up, and the down projections as one linear over the concatenated K (activations
             pre-scaled by the sink weights, so one output: the sum the combine forms anyway); its
             [H, S * I] weight is a re-laid copy, which the loader would have to store instead.
Timed as bench_moe_nvfp4 times: CUDA-graph replay of CALLS calls, each on its own copy of the
weights (the L2 never holds the next call's), median over replays.

    python benchmark/bench_sink_gemms.py --out sink_gemms.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from benchmark.bench_moe_nvfp4 import time_graph  # noqa: E402
from benchmark.bench_one_batch import git_commit  # noqa: E402
from benchmark.hbm_ceiling import peak_tb_s  # noqa: E402
from sgl_inkling_kernels.moe_w4a16_cuda import sinks_blas  # noqa: E402
from sgl_inkling_kernels.sink_gemv import sinks_gemv  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=6144)
    p.add_argument("--inter", type=int, default=3072)
    p.add_argument("--sinks", type=int, default=2)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--out", default="")
    a = p.parse_args()
    h, i, s, topk = a.hidden, a.inter, a.sinks, 6
    g = torch.Generator(device="cuda").manual_seed(0)
    copies = []
    for _ in range(a.calls):
        sw13 = torch.randn(s, 2 * i, h, device="cuda", generator=g, dtype=torch.bfloat16) * h**-0.5
        sw2 = torch.randn(s, h, i, device="cuda", generator=g, dtype=torch.bfloat16) * i**-0.5
        w2cat = sw2.permute(1, 0, 2).reshape(h, s * i).contiguous()
        copies.append((sw13, sw2, sw13.reshape(s * 2 * i, h), w2cat))
    nbytes = copies[0][0].numel() * 2 + copies[0][1].numel() * 2

    def bmm(x, c, gam, out):
        sinks_blas(x, c[0], c[1], gam, out, topk)

    def cat_up(x, c, gam, out):
        h13 = F.linear(x, c[2]).view(x.shape[0], s, 2 * i).transpose(0, 1)  # [S, T, 2I]
        act = F.silu(h13[..., 0::2]) * h13[..., 1::2]
        y = torch.bmm(act, c[1].transpose(1, 2))
        out[:, topk : topk + s].copy_((y.float() * gam.t().float().unsqueeze(-1)).transpose(0, 1))

    def cat_both(x, c, gam, out):
        h13 = F.linear(x, c[2]).view(x.shape[0], s, 2 * i)
        act = F.silu(h13[..., 0::2]) * h13[..., 1::2] * gam.unsqueeze(-1).to(h13.dtype)  # [T, S, I]
        out[:, topk].copy_(F.linear(act.reshape(x.shape[0], s * i), c[3]))
        out[:, topk + 1 : topk + s].zero_()

    def gemv(block_j: int, block_n: int):
        return lambda x, c, gam, out: sinks_gemv(x, c[0], c[1], gam, out, topk, block_j=block_j, block_n=block_n)

    forms = [("bmm", bmm), ("cat_up", cat_up), ("cat_both", cat_both)]
    forms += [(f"gemv_{j}x{n}", gemv(j, n)) for j, n in ((16, 32), (32, 64), (64, 64))]
    rows = []
    for t in a.batch_sizes:
        xs = [torch.randn(t, h, device="cuda", dtype=torch.bfloat16) for _ in range(a.calls)]
        gam = torch.rand(t, s, device="cuda", dtype=torch.bfloat16)
        outs = {n: torch.zeros(t, topk + s, h, device="cuda") for n, _ in forms}
        row = {"batch_size": t, "bytes": nbytes}
        for name, fn in forms:
            ms = time_graph(lambda c, fn=fn, o=outs[name], xs=xs, gam=gam: fn(xs[c], copies[c], gam, o), a.calls, a.replays)
            fn(xs[0], copies[0], gam, outs[name])
            ref = outs["bmm"][:, topk:].float().sum(1)
            err = ((outs[name][:, topk:].float().sum(1) - ref).norm() / ref.norm()).item()
            row[name] = {"us": ms * 1e3, "tb_s": nbytes / ms / 1e9, "fraction_of_peak": nbytes / ms / 1e9 / peak_tb_s(),
                         "rel_err_vs_bmm": err}  # fmt: skip
        rows.append(row)
        print(f"T={t:3d}  " + "  ".join(f"{n} {row[n]['us']:6.1f} us {row[n]['tb_s']:.2f} TB/s"
                                        for n, _ in forms), flush=True)  # fmt: skip
    res = {"benchmark": "bench_sink_gemms", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "git_commit": git_commit()[0], "config": vars(a), "rows": rows}  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
