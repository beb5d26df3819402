"""Our Inkling model against the transformers port on the same inkling-tiny checkpoint.

inkling-tiny has a 16-token window and a 32-token rel_extent with log scaling from position 8, so
the prompts below cross all three.
"""

from __future__ import annotations

import pytest
import torch

from sgl_inkling.model_executor.model_loader import load_model

from .helpers import prompt_logits, random_prompt, seq_runner

LENGTHS = [5, 23, 41, 77]


def hf_logits(hf_model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([prompt])).logits[0].float()


def test_fp32_logits_match_port_in_one_mixed_batch(tiny_model, hf_model):
    runner = seq_runner(tiny_model)
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    seqs = [runner.new_seq() for _ in prompts]
    out = runner.step(seqs, prompts, all_logits=True)
    for s in seqs:
        runner.free(s)
    offset = 0
    for prompt in prompts:
        ours = out.logits[offset : offset + len(prompt)]
        ref = hf_logits(hf_model, prompt)
        offset += len(prompt)
        scale = ref.abs().max().item()
        err = (ours - ref).abs().max().item()
        # "within 1e-4 of the logit scale"; observed about 1e-6 of it.
        assert err <= 1e-4 * scale, f"len {len(prompt)}: max error {err:.3g} at logit scale {scale:.3g}"


def test_bf16_error_is_within_the_ports_own_bf16_error(tiny_path, hf_model):
    """bf16 has no exact answer, so both bf16 models are judged against the fp32 reference.

    With random weights a bf16 rounding can flip an MoE top-k choice, which moves some logits by
    several units in either implementation (seen: max errors of 4-11 for both). So the tolerance is
    statistical and relative to the port's own bf16 error over ~300 positions: the median per-position
    max error may be at most 1.5x the port's, and top-1 agreement with fp32 at most 10 points lower.
    (Observed: medians 0.19-0.30 for both; ours accumulates attention in fp32, the port in bf16.)
    """
    from transformers import InklingForConditionalGeneration

    ours = seq_runner(load_model(tiny_path, torch.bfloat16, "cpu", progress=False))
    hf_bf16 = InklingForConditionalGeneration.from_pretrained(
        tiny_path, dtype=torch.bfloat16, attn_implementation="eager"
    ).eval()
    ref, our, port = [], [], []
    for n in (23, 41, 77, 150):
        prompt = random_prompt(n, seed=100 + n)
        ref.append(hf_logits(hf_model, prompt))
        our.append(prompt_logits(ours, prompt))
        port.append(hf_logits(hf_bf16, prompt))
    ref, our, port = torch.cat(ref), torch.cat(our), torch.cat(port)
    our_med = (our - ref).abs().amax(-1).median().item()
    port_med = (port - ref).abs().amax(-1).median().item()
    our_top1 = (our.argmax(-1) == ref.argmax(-1)).float().mean().item()
    port_top1 = (port.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert our_med <= 1.5 * port_med, f"median max error: ours {our_med:.3g}, port {port_med:.3g}"
    assert our_top1 >= port_top1 - 0.10, f"top-1 agreement: ours {our_top1:.3f}, port {port_top1:.3f}"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_greedy_generation_matches_port_generate(tiny_model, hf_model, seed):
    prompt = random_prompt(12 + 9 * seed, seed=1000 + seed)
    ours = seq_runner(tiny_model).greedy(prompt, max_new_tokens=64)
    with torch.no_grad():
        ref = hf_model.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=64,
            min_new_tokens=64,
            do_sample=False,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert len(ref) == 64
    assert ours == ref
