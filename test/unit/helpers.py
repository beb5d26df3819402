"""Small helpers shared by the model tests."""

from __future__ import annotations

import contextlib
from functools import partial
from types import SimpleNamespace

import torch

from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner


def seq_runner(model, max_reqs: int = 8, max_tokens: int = 4096) -> SeqRunner:
    return SeqRunner(ModelRunner(model, max_reqs, 1024, max_tokens))


def random_prompt(n: int, seed: int, vocab: int = 199_990) -> list[int]:
    """Ordinary (non-special) token ids."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def prompt_logits(runner: SeqRunner, prompt: list[int]) -> torch.Tensor:
    """Logits at every position of one cold prefill."""
    seq = runner.new_seq()
    try:
        return runner.step([seq], [prompt], all_logits=True).logits
    finally:
        runner.free(seq)


def new_scheduler(args, tmp_path_factory):
    """An in-process Scheduler for checked `args`, on ipc sockets in a fresh temporary folder."""
    from sgl_inkling.managers.scheduler import Scheduler

    args.check()
    d = tmp_path_factory.mktemp("zmq")
    return Scheduler(args, args.model_path, f"ipc://{d}/in", f"ipc://{d}/out")


def close_scheduler(s) -> None:
    s.recv_sock.close(0)
    s.send_sock.close(0)


@contextlib.contextmanager
def in_process_scheduler(args, tmp_path_factory):
    """new_scheduler's Scheduler, its sockets closed after."""
    s = new_scheduler(args, tmp_path_factory)
    try:
        yield s
    finally:
        close_scheduler(s)


def draftable_scheduler(tmp_path_factory, radix: bool = False, **server_args):
    """An in-process Scheduler with MTP on inkling-tiny-draftable (radix cache off unless asked; more
    ServerArgs fields as keywords): a generator for module fixtures (`yield from`), closing its
    sockets after."""
    from sgl_inkling.models.inkling.tiny_draftable import ensure_draftable_checkpoint
    from sgl_inkling.server_args import ServerArgs

    path = str(ensure_draftable_checkpoint())
    args = ServerArgs(model_path=path, device="cpu", speculative_algorithm="MTP", disable_radix_cache=not radix,
                      **server_args)  # fmt: skip
    with in_process_scheduler(args, tmp_path_factory) as s:
        yield s


def assert_same_level_state(runner, row_a: int, row_b: int, q: int, runner_b=None, tol: float = 0.0) -> None:
    """Two request rows that consumed the same q tokens hold the same state at every level: short-conv
    and carried state of every layer, KV of every attention layer (trunk and MTP depths) that a
    later token can read. runner_b: row_b lives in another runner of the same model. tol: bit for
    bit when 0, else within that absolute and relative tolerance (states computed by other kernels)."""
    rb = runner_b or runner

    def same(x: torch.Tensor, y: torch.Tensor) -> bool:
        return torch.equal(x, y) if tol == 0 else torch.allclose(x, y, atol=tol, rtol=tol)

    for layer, ts in runner.sconv_pool.states.items():
        for t, u in zip(ts, rb.sconv_pool.states[layer]):
            assert same(t[row_a], u[row_b]), f"short-conv / carried state of layer {layer} differs"
    cfg = runner.model.cfg
    window = cfg.sliding_window_size
    for attn in runner.model.attention_layers():
        spec = attn.spec
        depth = spec.layer_id - cfg.num_hidden_layers  # < 0 for trunk layers
        first = max(0, depth + 1)  # depth d keeps no KV for tokens 0..d
        if spec.sliding:
            first = max(first, q - window + 1)
        kind = "swa" if spec.sliding else "full"
        sa = runner.req_to_token.read(kind, row_a, first, q)
        sb = rb.req_to_token.read(kind, row_b, first, q)
        ka, va = (runner.swa_pool if spec.sliding else runner.full_pool).buffers(spec.layer_id)
        kb, vb = (rb.swa_pool if spec.sliding else rb.full_pool).buffers(spec.layer_id)
        assert same(ka[sa], kb[sb]) and same(va[sa], vb[sb]), f"KV of layer {spec.layer_id}"


def replaying_graph_runner(spec):
    """DraftGraphRunner whose "graphs" run, eagerly, what a capture records: the step on the static
    buffers (mask included) of their bucket, the trunk's rollback apart; the inputs arrive through
    replay as on the GPU. The host starts are read for the CPU attention's loops (graphs use none)."""
    from sgl_inkling.speculative.draft_graphs import DraftGraphRunner

    g = DraftGraphRunner(spec.step, 4, depths=range(spec.num_steps + 1), capture=False, masks=True,
                         tails=spec.tail_lag)  # fmt: skip

    def replay(fn, bs: int, *args) -> None:
        g.replayed.append(bs)
        fn(bs, *args)

    g.replayed = []
    g.graphs = {(bs, k, t): SimpleNamespace(replay=partial(replay, g.run, bs, k, t))
                for bs in g.buckets for k, t in g.variants}  # fmt: skip
    g.catch_up_graphs = {(bs, f): SimpleNamespace(replay=partial(replay, g.run_catch_up, bs, f))
                         for bs in g.buckets for f in g.catch_up_firsts}  # fmt: skip
    g.restore_graphs = {bs: SimpleNamespace(replay=partial(g.restore, bs)) for bs in g.buckets}
    return g
