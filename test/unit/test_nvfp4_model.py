"""inkling-tiny-nvfp4 in float32 against the same model with its dequantized experts stored as fp32
tensors (the reference checkpoint, decoded here by the test's own NVFP4 decoder): logits within 1e-5
relative, greedy 64 tokens identical, at TP 1, TP 2 and TP 2 with EP 2 (gloo ranks); and MTP on
gives the greedy output of MTP off on the NVFP4 conversion of the draftable checkpoint."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from sgl_inkling.model_executor.model_loader import load_model
from test.unit.nvfp4_greedy import NEW_TOKENS, greedy_batch
from test.unit.test_nvfp4_loader import decode, read
from test.unit.tp_scenario import run_ranks

from .helpers import prompt_logits, random_prompt, seq_runner


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls: two threads on a loaded 2-core machine ran these loops 10x slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def dequantized_checkpoint(src, dst):
    """The NVFP4 checkpoint with each routed expert decoded to fp32 and its scales dropped: a plain
    (unquantized) Inkling checkpoint holding exactly the weights NVFP4 represents."""
    t = read(src)
    out = {}
    for name, x in t.items():
        if name.endswith((".scale", ".scale2", ".input_amax", ".original_shape")):
            continue
        out[name] = decode(x, t[name + ".scale"], t[name + ".scale2"]) if x.dtype == torch.uint8 else x
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / "model.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from sgl_inkling.models.inkling.tiny_nvfp4 import ensure_tiny_nvfp4_checkpoint

    nvfp4 = ensure_tiny_nvfp4_checkpoint()
    return nvfp4, dequantized_checkpoint(nvfp4, tmp_path_factory.mktemp("dequantized"))


@pytest.fixture(scope="module")
def models(paths):
    nvfp4, ref = (load_model(p, torch.float32, "cpu", progress=False) for p in paths)
    assert nvfp4.model.llm.layers[1].mlp.experts.nvfp4 and not ref.model.llm.layers[1].mlp.experts.nvfp4
    return nvfp4, ref


def test_prefill_logits_match_the_dequantized_reference(models):
    nvfp4, ref = (seq_runner(m) for m in models)
    for n, seed in ((5, 1), (40, 2), (100, 3)):  # within, across and far past the window of 16
        got, want = prompt_logits(nvfp4, random_prompt(n, seed)), prompt_logits(ref, random_prompt(n, seed))
        assert rel_err(got, want) <= 1e-5, n


def test_experts_in_the_kernel_code_layout_give_the_same_logits(paths, models):
    """On a GPU the loader rearranges the codes for the CUDA decode kernels (RoutedExperts.code_layout
    "mma"); on the CPU it leaves them. Rearranged here by hand, every path that reads them (here the
    reference experts, through the inverse) must still give the dequantized reference's logits."""
    from sgl_inkling.models.inkling.moe import RoutedExperts, use_kernel_layouts
    from sgl_inkling_kernels.nvfp4_layout import to_mma_layout

    model = load_model(paths[0], torch.float32, "cpu", progress=False)
    assert use_kernel_layouts(model) == 0  # CPU: the checkpoint's layout stays
    experts = [m for m in model.modules() if isinstance(m, RoutedExperts) and m.nvfp4]
    assert experts and all(m.code_layout == "checkpoint" for m in experts)
    for m in experts:
        for p in (m.w13_weight, m.w2_weight):
            to_mma_layout(p.data, inplace=True)
        m.code_layout = "mma"
    got = prompt_logits(seq_runner(model), random_prompt(40, 2))
    assert rel_err(got, prompt_logits(seq_runner(models[1]), random_prompt(40, 2))) <= 1e-5


def test_kernel_moe_of_one_token_matches_the_torch_path(paths):
    """A one-token MoE on the kernel path (the router's launch that also lays out the pairs where the CUDA
    decode kernels' layout asks for it, then fused_moe_nvfp4 in the interpreter) gives the torch path's
    output, in the checkpoint's code layout and in the mma one (whose CUDA block size the CPU's kernels do
    not take: they align for themselves)."""
    from sgl_inkling.models.inkling.moe import MoE
    from sgl_inkling_kernels._triton import kernel_dispatch
    from sgl_inkling_kernels.nvfp4_layout import to_mma_layout

    model = load_model(paths[0], torch.float32, "cpu", progress=False)
    moe = next(m for m in model.modules() if isinstance(m, MoE) and m.experts.nvfp4)
    x = torch.randn(1, model.cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    for layout in ("checkpoint", "mma"):
        if layout == "mma":
            for p in (moe.experts.w13_weight, moe.experts.w2_weight):
                to_mma_layout(p.data, inplace=True)
            moe.experts.code_layout = "mma"
        assert (moe.align_block_m(1) is None) == (layout == "checkpoint")
        with torch.no_grad(), kernel_dispatch(True):
            got = moe(x)
        with torch.no_grad(), kernel_dispatch(False):
            want = moe(x)
        assert rel_err(got, want) <= 1e-5, layout


def test_kernel_moe_leaves_its_slots_for_the_next_launch_when_asked(paths):
    """MoE(x, defer_slot_sum=True) on the kernel path returns the per-slot outputs (the FFN output conv
    sums them in its launch at decode): summed, the same bits as the MoE's own output, and within 1e-5
    of the torch path's, which returns rows either way."""
    from sgl_inkling.models.inkling.moe import MoE
    from sgl_inkling_kernels._triton import kernel_dispatch
    from sgl_inkling_kernels.moe_slots import UnsummedSlots, sum_slots

    model = load_model(paths[0], torch.float32, "cpu", progress=False)
    moe = next(m for m in model.modules() if isinstance(m, MoE) and m.experts.nvfp4)
    x = torch.randn(3, model.cfg.hidden_size, generator=torch.Generator().manual_seed(6))
    with torch.no_grad(), kernel_dispatch(True):
        slots, rows = moe(x, defer_slot_sum=True), moe(x)
    assert isinstance(slots, UnsummedSlots) and slots.out.shape[1] == moe.gate.top_k + model.cfg.n_shared_experts
    assert torch.equal(sum_slots(slots), rows)
    with torch.no_grad(), kernel_dispatch(False):
        want = moe(x, defer_slot_sum=True)
    assert isinstance(want, torch.Tensor) and rel_err(rows, want) <= 1e-5


@pytest.fixture(scope="module")
def greedy(models):
    return tuple(greedy_batch(m) for m in models)


def test_greedy_64_matches_the_dequantized_reference(greedy):
    got, want = greedy
    assert len(got["tokens"][0]) == NEW_TOKENS
    assert got["tokens"] == want["tokens"]
    assert len(set(got["tokens"][0])) > 4, "a degenerate (repeating) continuation would prove little"
    assert rel_err(got["logits"], want["logits"]) <= 1e-5


@pytest.mark.parametrize("ep", [1, 2], ids=["tp2", "tp2-ep2"])
def test_tensor_parallel_matches_the_dequantized_reference(paths, greedy, tmp_path, ep):
    """Sharded NVFP4 (each rank's codes and scale blocks decode bit for bit: test_nvfp4_loader) gives
    TP 1's greedy tokens; logits differ only by the order of the partial-sum reduction, as in BF16."""
    for res in run_ranks(paths[0], tmp_path, 2, ep, run=greedy_batch):
        for tp1 in greedy:  # NVFP4 and the dequantized reference at TP 1
            assert res["tokens"] == tp1["tokens"]
            torch.testing.assert_close(res["logits"], tp1["logits"], rtol=1e-4, atol=1e-4)


def run_scheduler(path: str, tmp_path, prompts: list[list[int]], mtp: bool) -> list[tuple]:
    """Greedy requests through an in-process scheduler (one batch), MTP with 3 depths or off."""
    from sgl_inkling.managers.io_struct import TokenizedGenerateReq
    from sgl_inkling.managers.scheduler import Scheduler
    from sgl_inkling.sampling.sampling_params import SamplingParams
    from sgl_inkling.server_args import ServerArgs

    spec = {"speculative_algorithm": "MTP", "speculative_num_steps": 3} if mtp else {}
    args = ServerArgs(model_path=path, device="cpu", **spec)
    args.check()
    s = Scheduler(args, path, f"ipc://{tmp_path}/in{mtp}", f"ipc://{tmp_path}/out{mtp}")
    try:
        reqs = []
        for i, p in enumerate(prompts):
            sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, "max_new_tokens": 30})
            s.handle(TokenizedGenerateReq(rid=f"r{i}", input_ids=list(p), sampling_params=sp))
            reqs.append(s.waiting[-1])
        while any(not r.finished for r in reqs):
            s.step()
            s.outbox.clear()
        assert s.runner.model.model.llm.layers[1].mlp.experts.nvfp4
        return [(r.output_ids, r.spec_verify_ct, r.spec_accepted_drafts) for r in reqs]
    finally:
        s.recv_sock.close(0)
        s.send_sock.close(0)


def test_mtp_greedy_equals_non_speculative(tmp_path):
    from sgl_inkling.models.inkling.tiny_draftable import ensure_draftable_checkpoint
    from sgl_inkling.models.inkling.tiny_nvfp4 import ensure_tiny_nvfp4_checkpoint

    path = str(ensure_tiny_nvfp4_checkpoint(ensure_draftable_checkpoint(), "inkling-tiny-draftable-nvfp4"))
    prompts = [random_prompt(n, seed=300 + n) for n in (7, 40)]
    plain = run_scheduler(path, tmp_path, prompts, mtp=False)
    spec = run_scheduler(path, tmp_path, prompts, mtp=True)
    assert [x[0] for x in spec] == [x[0] for x in plain]
    steps, accepted = sum(x[1] for x in spec), sum(x[2] for x in spec)
    assert 0 < accepted < 3 * steps, "the workload must both accept and reject drafts"
