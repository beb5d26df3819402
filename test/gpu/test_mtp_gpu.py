"""MTP on the GPU: greedy output with MTP equals greedy output without it (inkling-tiny-draftable and
inkling-slice with dummy weights; batch 1 and 32; radix cache on and off; a JSON-schema grammar).
Verify (with greedy acceptance) and the draft step replay from CUDA graphs; grammar-constrained
requests draft in the same graphs (their first draft masked from the graphs' static bitmask).

In float32 the outputs must be identical. In bfloat16 the verify forward (K + 1 tokens per
sequence, extend kernels) and plain decode (decode kernels) round differently, so a sequence may
leave the reference at a near-tie. The tolerance is measured, not guessed: on the tokens both runs
chose, the two paths' logprobs of the same token differ by at most `noise` (the case's maximum), so
where MTP leaves the reference, its token and the reference's, scored by one prefill of each
sequence on their common prefix, must be within 2 * noise + 2 * scorer_noise of each other (the
scorer's own distance from each run's logprobs, measured the same way; dummy weights tie often,
several tokens at once, so the reference's top few need not hold MTP's token). Set
MTP_GPU_REPORT=<path> to get the figures (noise, gaps) as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ROOT = Path(__file__).resolve().parents[2]
REPORT: dict = {}

SCHEMA = {
    "type": "object",
    "properties": {"nm": {"type": "string", "maxLength": 5}, "st": {"enum": ["on", "off"]}},
    "required": ["nm", "st"],
    "additionalProperties": False,
}


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 199_990, (8 + (37 * i) % 200,), generator=g).tolist() for i in range(n)]


def _run(path: str, jobs: dict, ref: dict | None = None, **server) -> tuple[dict, dict, dict]:
    """One engine launch runs every job (name -> (prompts, sampling params)). Given the reference's
    outputs, the same engine then scores both runs' sequences with one prefill each (see _scores)."""
    import sglang as sgl

    eng = sgl.Engine(model_path=path, random_seed=0, **server)
    try:
        outs = {
            name: eng.generate(input_ids=prompts, sampling_params=params, return_logprob=True, top_logprobs_num=2)
            for name, (prompts, params) in jobs.items()
        }
        info = eng.get_server_info()["internal_states"][0]
        scores = {}
        for name, (prompts, _) in jobs.items():
            if ref is not None:
                scores[name] = [_scores(eng, prompts, r) for r in (ref[name], outs[name])]
    finally:
        eng.shutdown()
    return outs, info, scores


def _scores(eng, prompts: list[list[int]], outs: list[dict]) -> list[list[float]]:
    """Each generated token's logprob given the tokens before it, from one prefill of prompt + output
    (no grammar: two tokens both runs' grammars allowed differ by the same amount masked or not)."""
    res = eng.generate(input_ids=[p + o["output_ids"] for p, o in zip(prompts, outs)],
                       sampling_params={"max_new_tokens": 1, "temperature": 0}, return_logprob=True,
                       logprob_start_len=[len(p) for p in prompts])  # fmt: skip
    return [[lp for lp, *_ in r["meta_info"]["input_token_logprobs"]] for r in res]


def _check_model(label: str, path: str, jobs: dict, exact: bool, **server) -> None:
    ref, _, _ = _run(path, jobs, **server)
    for radix in (True, False):
        got, info, scores = _run(path, jobs, ref, speculative_algorithm="MTP", disable_radix_cache=not radix, **server)
        # Grammar jobs' logprobs are renormalized over the allowed tokens and the scoring prefill's are
        # not: the scorer's noise comes from the free jobs of the same engine.
        free = [n for n, (_, params) in jobs.items() if "json_schema" not in params]
        scorer_noise = max(_scorer_noise(ref[n], got[n], scores[n]) for n in free)
        for name in jobs:
            case = f"{label}/{name}/radix={radix}"
            _compare(case, ref[name], got[name], scores[name], scorer_noise, exact)
            REPORT[case]["avg_spec_accept_length"] = info["avg_spec_accept_length"]
            REPORT[case]["verify_cuda_graph"] = info["spec_verify_cuda_graph"]
            REPORT[case]["draft_cuda_graph"] = info["spec_draft_cuda_graph"]
            REPORT[case]["fixed_shape_draft_steps"] = info["spec_fixed_shape_draft_steps"]
            REPORT[case]["verify_steps"] = info["spec_verify_steps"]
            REPORT[case]["draft_steps_by_k"] = info["spec_draft_steps_by_k"]  # adaptive (default on)
            REPORT[case]["step_costs"] = info["spec_step_costs"]  # measured from the graphs at start-up
            REPORT[case]["plain_decode_steps"] = info["spec_plain_decode_steps"]  # k = 0: the decode graph
            REPORT[case]["depth_catch_ups"] = info["spec_depth_catch_ups"]
            REPORT[case]["spec_cuda_graph_max_bs"] = info["spec_cuda_graph_max_bs"]
        assert info["spec_verify_cuda_graph"], "CUDA graphs are on by default: verify must replay from them"
        assert info["spec_draft_cuda_graph"] and info["spec_fixed_shape_draft_steps"] > 0, "draft steps must replay too"
        for g in got.get("json_schema", []):
            assert json.loads(g["text"]).keys() == {"nm", "st"}


def _scorer_noise(ref, got, scores) -> float:
    """The scoring prefill against each run's own logprobs for the tokens it chose."""
    pairs = [(x[0], y) for outs, lps in zip((ref, got), scores) for o, sc in zip(outs, lps)
             for x, y in zip(o["meta_info"]["output_token_logprobs"], sc)]  # fmt: skip
    return max(abs(x - y) for x, y in pairs)


def _compare(name: str, ref, got, scores, scorer_noise: float, exact: bool) -> None:
    """scores: (reference, MTP) sequences' per-token logprobs from one prefill each, by one engine."""
    same, diverged, noise = 0, [], 0.0
    for r, g, ref_lps, got_lps in zip(ref, got, *scores):
        a, b = r["output_ids"], g["output_ids"]
        j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        # The same token at the same position, scored by plain decode and by verify: bf16's noise.
        lr, lg = r["meta_info"]["output_token_logprobs"], g["meta_info"]["output_token_logprobs"]
        noise = max([noise] + [abs(x[0] - y[0]) for x, y in zip(lr[:j], lg[:j])])
        if a == b:
            same += 1
            continue
        # Both tokens at the divergence, scored by the same forward on the same prefix.
        diverged.append({"at": j, "scored_gap": ref_lps[j] - got_lps[j]})
    # Decode and verify can swap two tokens whose gap is under 2 * noise; the scorer sees that gap
    # within 2 * scorer_noise of what decode saw.
    tol = 2 * noise + 2 * scorer_noise
    REPORT[name] = {"sequences": len(ref), "identical": same, "diverged": diverged, "logprob_noise": noise,
                    "scorer_noise": scorer_noise, "tolerance": tol}  # fmt: skip
    if exact:
        assert not diverged, (name, diverged)
    else:
        bad = [d for d in diverged if d["scored_gap"] > tol]
        assert not bad, (name, f"noise {noise:.4f}, scorer noise {scorer_noise:.4f}", bad)


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    out = os.environ.get("MTP_GPU_REPORT")
    if out:
        Path(out).write_text(json.dumps({"cases": REPORT}, indent=2))


def _jobs(new_tokens: int, grammar: bool) -> dict:
    greedy = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    jobs = {"bs1": (_prompts(1), greedy), "bs32": (_prompts(32), greedy)}
    if grammar:
        jobs["json_schema"] = (_prompts(8), {"temperature": 0, "max_new_tokens": 100, "json_schema": json.dumps(SCHEMA)})
    return jobs


def test_tiny_draftable_float32_exact():
    from sgl_inkling.models.inkling.tiny_draftable import ensure_draftable_checkpoint

    path = str(ensure_draftable_checkpoint())
    _check_model("tiny-draftable/float32", path, _jobs(64, grammar=True), exact=True, dtype="float32")


def test_slice_dummy_bfloat16():
    from sgl_inkling.model_executor.model_loader import build_model
    from sgl_inkling.models.inkling.slice_config import slice_config

    # The bf16 slice's weights, counted on the meta device (104 GB): an 80 GB H100 cannot hold them,
    # and the server ran out of memory loading them there.
    weights = sum(p.numel() * p.element_size() for p in build_model(slice_config(), torch.bfloat16, "meta").parameters())
    total = torch.cuda.get_device_properties(0).total_memory
    if weights > 0.9 * total:
        pytest.skip(f"the bf16 slice's weights ({weights / 1e9:.0f} GB) do not fit this card ({total / 1e9:.0f} GB)")
    sys.path.insert(0, str(ROOT))
    from benchmark.slice_dir import write_slice_dir

    path = str(write_slice_dir())
    _check_model("slice/bfloat16", path, _jobs(32, grammar=True), exact=False, load_format="dummy")
