"""Compile Triton kernels for a CUDA target without a GPU (Triton's wheel carries ptxas): catches
what the CPU interpreter accepts but the compiler rejects (branch type unification, dot operand
types, layouts). Run as a script with TRITON_INTERPRET=0, so the kernel modules decorate for the
compiler (test_gpu_compile.py does); prints one line per case, exits 1 if any failed."""

from __future__ import annotations

import importlib
import sys
import traceback

TARGET = ("cuda", 90, 32)  # Hopper (H200)


def _qkvr(dt, to_cache):
    ptr = {n: f"*{dt}" for n in ("X", "Q", "Kout", "Vout", "QNormW", "KNormW")}
    ptr.update({n: "*fp32" for n in ("KConvW", "VConvW", "KState", "VState")}, Rows="*i64", Slots="*i64")
    consts = dict(NH=64, NKV=8, D=128, BLOCK_D=128, K=4, BLOCK_K=4, TO_CACHE=to_cache)
    return ("qkvr_epilogue", "_qkvr_epilogue_kernel", ptr, consts, ("eps",), 1)


def _conv_norm(dt, norm, slots=0):
    # slots > 0: X is a MoE's unsummed fp32 slots (6 routed + 2 sinks), summed in the conv's launch.
    ptr = {n: f"*{dt}" for n in ("X", "Res", "Summed")}
    ptr.update(ConvW="*fp32", State="*fp32", Rows="*i64", SumSq="*fp32" if norm else f"*{dt}", Ids="*i64")
    if slots:
        ptr["X"] = "*fp32"
    consts = dict(HAS_NORM=norm, K=4, BLOCK_K=4, BLOCK_C=256, TOPK=6, SLOTS=slots)
    return ("sconv_norm", "_sconv_add_kernel", ptr, consts, (), 4)


def _sum_slots(dt):
    ptr = {"Out": "*fp32", "Ids": "*i64", "Y": f"*{dt}"}
    return ("moe_slots", "_sum_slots_kernel", ptr, dict(TOPK=6, SLOTS=8, BLOCK=1024), (), 4)


def _conv_rmsnorm(dt):
    ptr = {"Summed": f"*{dt}", "SumSq": "*fp32", "NormW": f"*{dt}", "Normed": f"*{dt}"}
    return ("sconv_norm", "_rmsnorm_blocks_kernel", ptr, dict(BLOCK_N=32, BLOCK_C=256), ("eps",), 4)


def _router(dt, aligned=False):
    # Weights are fp32 holding values rounded to the activations' dtype (ROUND).
    import triton.language as tl

    ptr = {"Logits": "*fp32", "Bias": "*fp32", "GlobalScale": "*fp32", "Ids": "*i64", "Weights": "*fp32",
           "SharedWeights": "*fp32", "Pairs": "*i64", "BlockExpert": "*i64"}  # fmt: skip
    consts = dict(E=256, S=2, TOPK=6, PARTS=12, BLOCK_E=256, BLOCK_S=2, BLOCK_K=8,
                  ROUND=tl.bfloat16 if dt == "bf16" else tl.float32)  # fmt: skip
    if aligned:
        return ("router", "_route_align_kernel", ptr, consts | dict(BLOCK_M=8, P=8), ("route_scale",), 1)
    return ("router", "_router_kernel", ptr, consts, ("route_scale",), 1)


def _align_small():
    ptr = {"Ids": "*i64", "Pairs": "*i64", "BlockExpert": "*i64"}
    return ("fused_moe", "_moe_align_small_kernel", ptr, dict(BLOCK_M=8, P=128), (), 4)


def _align_sorted():
    from sgl_inkling_kernels.fused_moe import SORT_ALIGN_PAIRS

    ptr = {"Ids": "*i64", "Pairs": "*i64", "BlockExpert": "*i64"}
    consts = dict(LOG_P=SORT_ALIGN_PAIRS.bit_length() - 1)
    return ("fused_moe", "_moe_align_sort_kernel", ptr, consts, (), 4)


def _router_gemv(dt):
    consts = dict(BLOCK_N=8, BLOCK_H=256)
    return ("router", "_router_gemv_kernel", {"X": f"*{dt}", "W": "*fp32", "Out": "*fp32"}, consts, (), 4)


def _dense_gemv(dt, pre_k):
    consts = dict(BLOCK_T=16, BLOCK_N=32, BLOCK_K=256, PRE_K=pre_k, UPCAST=False, PREC="ieee" if dt == "fp32" else "tf32")
    return ("dense_gemv", "_dense_gemv_kernel", {n: f"*{dt}" for n in ("X", "W", "Y")}, consts, (), 4)


def _split(dt, tau, merge=True, prefetch=False):
    # tau: a full layer (8 heads a KV head); else a sliding one (4), as Inkling's.
    g = 8 if tau else 4
    ptr = {n: f"*{dt}" for n in ("Q", "K", "V", "Rel", "Table", "Out")}
    ptr.update(ReqToTok="*i64", ReqIdx="*i64", Pos="*i64", Tau="*fp32" if tau else f"*{dt}", PartO="*fp32",
               PartLse="*fp32", Counters="*i32" if merge else "*fp32")  # fmt: skip
    consts = dict(G=g, BLOCK_G=16, D=128, BLOCK_D=128, R=16, BLOCK_R=16, BLOCK_N=64, HAS_TAU=tau, HAS_WINDOW=not tau,
                  UPCAST=False, PREC="ieee" if dt == "fp32" else "tf32", MERGE=merge, BLOCK_GM=g,
                  SPLIT_CHUNK=4 if g > 4 else 8, PREFETCH=prefetch)  # fmt: skip
    return ("decode_attention", "_decode_split_kernel", ptr, consts, ("scaling",), 4)


def _merge():
    ptr = {"PartO": "*fp32", "PartLse": "*fp32", "Out": "*bf16"}
    return ("decode_attention", "_decode_merge_kernel", ptr, dict(D=128, BLOCK_D=128, BLOCK_S=64), (), 4)


CASES = (
    [_qkvr(dt, c) for dt in ("bf16", "fp32") for c in (False, True)]
    + [_conv_norm(dt, n, slots) for dt in ("bf16", "fp32") for n in (False, True) for slots in (0, 8)]
    + [_sum_slots(dt) for dt in ("bf16", "fp32")]
    + [_conv_rmsnorm(dt) for dt in ("bf16", "fp32")]
    + [_router(dt, aligned) for dt in ("bf16", "fp32") for aligned in (False, True)]
    + [_align_small(), _align_sorted()]
    + [_router_gemv(dt) for dt in ("bf16", "fp32")]
    + [_dense_gemv(dt, pre_k) for dt in ("bf16", "fp32") for pre_k in (0, 256)]
    + [_split(dt, tau, merge, pre) for dt in ("bf16", "fp32") for tau in (False, True) for merge in (True, False)
       for pre in (False, True)]
    + [_merge()]
)


def compile_case(module, name, pointers, constexprs, floats, num_warps):
    """Every parameter not a pointer, constexpr or float is an i32; kernels with a PDL constexpr take
    it on, as they launch on Hopper (pdl_launch)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = getattr(importlib.import_module(f"sgl_inkling_kernels.{module}"), name)
    if any(p.name == "PDL" for p in kernel.params):
        constexprs = {**constexprs, "PDL": True}
    sig = {}
    for p in kernel.params:
        n = p.name
        sig[n] = pointers.get(n) or ("constexpr" if n in constexprs else "fp32" if n in floats else "i32")
    return triton.compile(ASTSource(kernel, sig, constexprs), target=GPUTarget(*TARGET), options={"num_warps": num_warps})


def main() -> int:
    failed = 0
    for case in CASES:
        label = f"{case[1]} {' '.join(sorted(set(case[2].values())))} {case[3]}"
        try:
            compile_case(*case)
            print("ok", label)
        except Exception:  # noqa: BLE001 - report every case, then fail
            failed += 1
            print("FAIL", label)
            traceback.print_exc(limit=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
