"""Probe: does prefetching the o-proj weight's first N MB into the L2 during decode attention make the
o-proj GEMM that follows faster (batch 1, CUDA graph)? Prints ms per (attention + o-proj)."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "python")]
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmark.bench_moe_nvfp4 import time_graph  # noqa: E402
from sgl_inkling_kernels.decode_attention import decode_attention, default_num_splits  # noqa: E402


@triton.jit
def _prefetch_kernel(Ptr, Sink, n_lines, STRIDE: tl.constexpr, LINES: tl.constexpr, POLICY: tl.constexpr):
    offs = tl.program_id(0) * LINES + tl.arange(0, LINES)
    offs = tl.minimum(offs, n_lines - 1).to(tl.int64)
    if POLICY == 0:
        r = tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [Ptr + offs * STRIDE],
                                      dtype=tl.int32, is_pure=False, pack=1)
    else:
        r = tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                      [Ptr + offs * STRIDE], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(Sink + offs, r.to(tl.int8), mask=r != 0)


def prefetch(w, nbytes, stride=128, policy=0, sink=None):
    flat = w.view(-1).view(torch.uint8)
    nbytes = min(nbytes, flat.numel())
    n = nbytes // stride
    lines = 1024
    _prefetch_kernel[(triton.cdiv(n, lines),)](flat, sink, n, STRIDE=stride, LINES=lines, POLICY=policy, num_warps=4)


@triton.jit
def _touch_kernel(Ptr, Out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(Ptr + offs, mask=offs < n, other=0)
    s = tl.sum(x.to(tl.int32), 0)
    tl.store(Out + tl.program_id(0), s, mask=s == 123456789)


def touch(w, nbytes, out):
    flat = w.view(-1).view(torch.int32)
    n = min(nbytes, w.numel() * 2) // 4
    _touch_kernel[(triton.cdiv(n, 4096),)](flat, out, n, BLOCK=4096, num_warps=4)


def main():
    H, NH, HD, DREL, NKV, CTX = 6144, 64, 128, 16, 8, 1024
    calls = 8
    bf = torch.bfloat16
    wo = [torch.randn(H, NH * HD, device="cuda", dtype=bf) * 0.01 for _ in range(calls)]
    slots = CTX + 1
    kb = [torch.randn(slots, NKV, HD, device="cuda", dtype=bf) for _ in range(calls)]
    vb = [torch.randn(slots, NKV, HD, device="cuda", dtype=bf) for _ in range(calls)]
    table = (1 + torch.arange(CTX, device="cuda")).view(1, CTX)
    pos = torch.full((1,), CTX - 1, device="cuda")
    rows = torch.arange(1, device="cuda")
    rel_table = torch.randn(DREL, 1024, device="cuda", dtype=bf)
    qs = [torch.randn(1, NH, HD, device="cuda", dtype=bf) for _ in range(calls)]
    rels = [torch.randn(1, NH, DREL, device="cuda", dtype=bf) for _ in range(calls)]
    sink = torch.zeros(1 << 22, dtype=torch.int8, device="cuda")
    out32 = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = default_num_splits(1, NKV, CTX, 64, sms, 8)
    side = torch.cuda.Stream()

    def attn(c):
        return decode_attention(qs[c], kb[c], vb[c], table, rows, pos, rels[c], rel_table, None, 1 / HD, None,
                                num_splits=splits)

    def gemm(c, o):
        return o.reshape(1, -1) @ wo[c].t()

    o_fixed = torch.randn(1, NH * HD, device="cuda", dtype=bf)

    def base(c):
        gemm(c, attn(c))

    def only_gemm(c):
        gemm(c, o_fixed)

    def only_attn(c):
        attn(c)

    def pre_main(mb, stride=128, policy=0):
        def f(c):
            prefetch(wo[c], mb << 20, stride, policy, sink)
            gemm(c, attn(c))
        return f

    def pre_side(mb, stride=128, policy=0, kind="prefetch"):
        def f(c):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                if kind == "prefetch":
                    prefetch(wo[c], mb << 20, stride, policy, sink)
                else:
                    touch(wo[c], mb << 20, out32)
            o = attn(c)
            torch.cuda.current_stream().wait_stream(side)
            gemm(c, o)
        return f

    cases = [("attn+gemm", base), ("gemm only", only_gemm), ("attn only", only_attn)]
    for mb in (8, 16, 24, 32, 48):
        cases.append((f"main prefetch {mb} MB", pre_main(mb)))
        cases.append((f"side prefetch {mb} MB", pre_side(mb)))
    cases += [("side prefetch 32 MB s32", pre_side(32, 32)), ("side prefetch 32 MB evict_last", pre_side(32, 128, 1)),
              ("side touch 16 MB", pre_side(16, kind="touch")), ("side touch 32 MB", pre_side(32, kind="touch"))]
    for name, fn in cases:
        try:
            us = time_graph(fn, calls, 30) * 1e3
            print(f"{name:34s} {us:8.2f} us")
        except Exception as e:  # noqa: BLE001
            print(f"{name:34s} FAILED {type(e).__name__}: {str(e)[:200]}")


main()
