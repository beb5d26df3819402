"""No Triton kernel compiles after start-up warm-up: a mixed workload (cold and chunked prefills of
many lengths, ragged extend batches, short extensions as MTP's verify makes, decode at every batch
size inside and beyond the CUDA-graph buckets) on inkling-tiny, bf16, through a ModelRunner that
warmed up and captured its graphs. A positive control shows the compile hook fires."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 199_990, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _serve_mixed(runner, max_reqs: int) -> list:
    """The kernels a mixed workload compiles after the runner's warm-up and capture."""
    from sgl_inkling_kernels.jit_watch import compile_watch

    with compile_watch() as compiled:
        seqs = [runner.new_seq() for _ in range(max_reqs)]
        for i, n in enumerate([3, 17, 30, 64, 65, 90, 200, 301]):  # cold prefills, one path each
            runner.step([seqs[i]], [_tokens(n, i)])
        runner.step([seqs[0]], [_tokens(130, 50)])  # chunked: resumes from a cached prefix
        runner.step(seqs[:3], [_tokens(5, 51), _tokens(40, 52), [7]])  # ragged extend
        runner.step(seqs[:4], [_tokens(9, 53 + i) for i in range(4)])  # short extensions (verify-like)
        for bs in range(1, max_reqs + 1):  # graph buckets (<= 4) and eager decode beyond them
            for _ in range(2):
                runner.step(seqs[:bs], [[11]] * bs)
        torch.cuda.synchronize()
    for s in seqs:
        runner.free(s)
    return compiled


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_no_compile_after_warmup(tiny_path, dtype):
    from sgl_inkling.model_executor.model_loader import load_model
    from sgl_inkling.model_executor.model_runner import ModelRunner
    from sgl_inkling.model_executor.seq_runner import SeqRunner
    from sgl_inkling_kernels.jit_watch import compile_watch
    from sgl_inkling_kernels.rmsnorm import rmsnorm

    model = load_model(tiny_path, dtype, "cuda", progress=False)
    max_reqs = 8
    runner = SeqRunner(ModelRunner(model, max_reqs, 1024, 8192, attention_backend="triton", cuda_graph_max_bs=4))
    compiled = _serve_mixed(runner, max_reqs)
    assert compiled == [], f"{len(compiled)} kernel(s) compiled after warm-up: {compiled[:3]}"
    # Control: a shape no serving path uses compiles, and the watch sees it.
    with compile_watch() as control:
        x = torch.randn(3, 72, device="cuda", dtype=dtype)
        rmsnorm(x, torch.ones(72, device="cuda", dtype=dtype), 1e-6)
    assert len(control) >= 1


def test_no_compile_after_warmup_with_nvfp4_experts():
    # NVFP4 routed experts at widths the CUDA decode kernels take (H and I multiples of 128), so
    # decode and short extends run them with the sinks' Triton GEMVs beside: every token tile of
    # those (batches of 1-64 tokens, here up to 64-token extends) must be warm-up's.
    import copy

    from sgl_inkling.model_executor.model_loader import build_model, with_expert_quant
    from sgl_inkling.model_executor.model_runner import ModelRunner
    from sgl_inkling.model_executor.seq_runner import SeqRunner
    from sgl_inkling.models.inkling.config import InklingConfig
    from sgl_inkling.models.inkling.tiny import TINY_CONFIG
    from sgl_inkling.models.inkling.weights import init_dummy_weights

    cfg = copy.deepcopy(TINY_CONFIG)
    cfg["text_config"].update(hidden_size=256, moe_intermediate_size=128, n_routed_experts=16,
                              num_experts_per_tok=6, n_shared_experts=2)  # fmt: skip
    cfg["mtp_config"], cfg["vision_config"], cfg["audio_config"] = {}, {}, {}
    config = with_expert_quant(InklingConfig.from_dict(cfg), "nvfp4")
    model = build_model(config, torch.bfloat16, "cuda")
    init_dummy_weights(model)
    max_reqs = 8
    runner = SeqRunner(ModelRunner(model, max_reqs, 1024, 8192, attention_backend="triton", cuda_graph_max_bs=4))
    compiled = _serve_mixed(runner, max_reqs)
    assert compiled == [], f"{len(compiled)} kernel(s) compiled after warm-up: {compiled[:3]}"


def test_grammar_mask_kernel_compiles_at_start_up():
    """xgrammar's Triton mask kernel, warmed up as the scheduler does at start-up, compiles nothing
    for any batch of constrained rows (all rows of batches 1 to 40, and every subset size of a batch
    of 40), and masks exactly: allowed tokens keep their logit, the rest become -inf."""
    import xgrammar as xgr

    from sgl_inkling.constrained.mask import GrammarMasker, unpack_bitmask
    from sgl_inkling_kernels.jit_watch import compile_watch

    vocab, max_rows = 1000, 40
    masker = GrammarMasker(vocab)
    masker.warm_up(torch.device("cuda"), max_rows)
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, xgr.get_bitmask_shape(max_rows, vocab), generator=g, dtype=torch.int64)
    bitmask = bits.to(xgr.bitmask_dtype).cuda()
    with compile_watch() as compiled:
        for bs in range(1, max_rows + 1):
            logits = torch.randn(bs, vocab, device="cuda")
            want = logits.clone().masked_fill_(~unpack_bitmask(bitmask[:bs].cpu(), vocab).cuda(), float("-inf"))
            masker._apply_kernel(logits, bitmask[:bs], list(range(bs)))
            assert torch.equal(logits, want)
            sub = list(range(0, bs, 2))
            logits = torch.randn(max_rows, vocab, device="cuda")
            want = logits.clone()
            want[sub] = want[sub].masked_fill(~unpack_bitmask(bitmask[sub].cpu(), vocab).cuda(), float("-inf"))
            masker._apply_kernel(logits, bitmask, sub)
            assert torch.equal(logits, want)
        torch.cuda.synchronize()
    assert compiled == [], f"{len(compiled)} mask kernel(s) compiled after warm-up: {compiled[:3]}"
