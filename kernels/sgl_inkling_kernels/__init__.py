"""Triton kernels for Inkling, each module holding a kernel, its plain-function API and a torch reference.

    decode_attention  paged decode attention: GQA, in-kernel relative bias, window, log scaling
    extend_attention  paged extend (prefill over a cached prefix), same features
    sconv             fused short conv (conv + residual + state update), decode and extend
    router            expert-sink router (sigmoid + bias top-k, sink renormalisation, scales; at decode
                      with its fp32 GEMM split-K in-kernel)
    fused_moe         grouped-GEMM SwiGLU experts, routed and shared, reading only selected experts
    fused_moe_nvfp4   the same over NVFP4 routed experts (W4A16: codes decoded in registers) + BF16 sinks
    moe_launch        the gate/up + down launch pair the Triton NVFP4 paths share
    moe_w4a16_cuda    its decode path on CUDA GPUs: mma.sync W4A16 kernels in CUDA C++ (csrc/), via ctypes
    cuda_build        builds a csrc/ source with nvcc at first use (cached per machine)
    rmsnorm           RMSNorm and fused residual-add + RMSNorm
    qkvr_epilogue     decode: q norm, K conv + k norm, V conv after the packed q/k/v/r GEMM
    sconv_norm        decode: output short conv + residual add (+ the next RMSNorm)
    jit_watch         a hook on Triton compiles (no compile after warm-up)
    jit_keys          each launch's compile key from its arguments (the same check under the interpreter)

Importing this package does not import Triton; the modules do, and fall back to stand-ins (their
torch references still work) where Triton is missing. `_triton.use_triton(t)` is the dispatch rule
for model code: kernels for CUDA tensors, references elsewhere.
"""
