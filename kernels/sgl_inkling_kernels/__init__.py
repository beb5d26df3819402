"""Triton kernels for Inkling, each module holding a kernel, its plain-function API and a torch reference.

    decode_attention  paged decode attention: GQA, in-kernel relative bias, window, log scaling
    extend_attention  paged extend (prefill over a cached prefix), same features
    sconv             fused short conv (conv + residual + state update), decode and extend
    router            expert-sink router (sigmoid + bias top-k, sink renormalisation, scales)
    fused_moe         grouped-GEMM SwiGLU experts, routed and shared, reading only selected experts
    fused_moe_nvfp4   the same over NVFP4 routed experts (W4A16: codes decoded in registers) + BF16 sinks
    rmsnorm           RMSNorm and fused residual-add + RMSNorm

Importing this package does not import Triton; the modules do, and fall back to stand-ins (their
torch references still work) where Triton is missing. `_triton.use_triton(t)` is the dispatch rule
for model code: kernels for CUDA tensors, references elsewhere.
"""
