"""One model-runner scenario run at any TP/EP size: used by test_tensor_parallel (parent: TP 1,
spawned gloo ranks: TP 2); run_ranks spawns the ranks for any such function (test_nvfp4_model
too). Everything compared is returned on the host."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from pathlib import Path

import torch

from sgl_inkling.distributed.parallel_state import destroy_distributed, init_distributed
from sgl_inkling.mem_cache.memory_pool import SCONV_ATTN, SCONV_K, SCONV_MLP
from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode
from sgl_inkling.model_executor.model_loader import load_model
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner
from test.unit.helpers import random_prompt

DECODE_STEPS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scenario(model) -> dict:
    """Two sequences prefilled together (longer than the sliding window), greedy batch decode, then
    MTP depths 0 (sliding) and 1 (full) over the first sequence's prompt."""
    runner = SeqRunner(ModelRunner(model, 4, 256, 1024))
    seqs = [runner.new_seq(), runner.new_seq()]
    prompts = [random_prompt(40, 1), random_prompt(23, 2)]
    out = runner.step(seqs, prompts)
    hidden = out.hidden[:40]
    logits, tokens = [out.logits], [out.logits.argmax(-1).tolist()]
    for _ in range(DECODE_STEPS):
        out = runner.step(seqs, [[t] for t in tokens[-1]])
        logits.append(out.logits)
        tokens.append(out.logits.argmax(-1).tolist())
    a = seqs[0]
    mtp_batch = ForwardBatch.build(
        ForwardMode.EXTEND,
        [prompts[0][1:] + [tokens[0][0]]],
        [a.row],
        [0],
        a.full_slots[0].tolist(),
        a.swa_slots[0].tolist(),
        "cpu",
        all_logits=True,
    )
    mtp = []
    for depth in (0, 1):
        o = runner.runner.forward_mtp(depth, hidden, mtp_batch)
        mtp.append(o.logits)
        hidden = o.hidden
    pool = runner.runner.sconv_pool
    full_layer = next(a.spec.layer_id for a in model.attention_layers() if not a.spec.sliding)
    return {
        "tokens": tokens,
        "logits": torch.stack([x for x in logits]),
        "mtp_logits": torch.stack(mtp),
        "sconv_shapes": {layer: [tuple(t.shape) for t in ts] for layer, ts in pool.states.items()},
        "attn_state": pool.state(full_layer, SCONV_ATTN)[a.row].clone(),
        "mlp_state": pool.state(full_layer, SCONV_MLP)[a.row].clone(),
        "k_state": pool.state(full_layer, SCONV_K)[a.row].clone(),
        "full_layer": full_layer,
        "kv_heads": (runner.runner.full_pool.layout.num_kv_heads, runner.runner.swa_pool.layout.num_kv_heads),
        "expert_shape": tuple(model.model.llm.layers[1].mlp.experts.w13_weight.shape),
    }


def rank_main(rank: int, tp: int, ep: int, port: int, model_path: str, out_dir: str, run=None) -> None:
    """Entry of a spawned rank: join the gloo group, load the sharded model, run (default: scenario),
    save what it returns."""
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    init_distributed(tp, rank, ep, f"tcp://127.0.0.1:{port}", "cpu")
    try:
        model = load_model(model_path, torch.float32, "cpu", progress=False)
        torch.save((run or scenario)(model), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        destroy_distributed()


def run_ranks(model_path, out_dir, tp: int, ep: int, run=None) -> list[dict]:
    """Spawn tp gloo ranks running `run` (a module-level function of the model) and return their results."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, tp, ep, port, str(model_path), str(out_dir), run))
             for r in range(tp)]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    for p in procs:
        if p.is_alive():
            p.kill()
        assert p.exitcode == 0, f"rank process {p.name} exited with {p.exitcode}"
    return [torch.load(Path(out_dir) / f"rank{r}.pt") for r in range(tp)]
