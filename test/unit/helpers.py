"""Small helpers shared by the model tests."""

from __future__ import annotations

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


def draftable_scheduler(tmp_path_factory):
    """An in-process Scheduler with MTP on inkling-tiny-draftable (radix cache off): a generator for
    module fixtures (`yield from`), closing its sockets after."""
    from sgl_inkling.managers.scheduler import Scheduler
    from sgl_inkling.models.inkling.tiny_draftable import ensure_draftable_checkpoint
    from sgl_inkling.server_args import ServerArgs

    path = str(ensure_draftable_checkpoint())
    args = ServerArgs(model_path=path, device="cpu", speculative_algorithm="MTP", disable_radix_cache=True)
    args.check()
    d = tmp_path_factory.mktemp("zmq")
    s = Scheduler(args, path, f"ipc://{d}/in", f"ipc://{d}/out")
    yield s
    s.recv_sock.close(0)
    s.send_sock.close(0)
