"""Start the scheduler and detokenizer processes and wait until the model is loaded."""

from __future__ import annotations

import logging
import multiprocessing as mp
import traceback
from dataclasses import dataclass

from sgl_inkling.managers.subprocess_utils import configure_logging, die_with_parent, ipc_addresses

logger = logging.getLogger(__name__)


@dataclass
class Backend:
    """Handles on the running child processes and the addresses to talk to them."""

    info: dict
    addrs: dict[str, str]
    procs: list[mp.Process]

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def shutdown(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def _run_scheduler(server_args, model_path: str, addrs: dict, pipe) -> None:
    die_with_parent()
    configure_logging(server_args.log_level)
    try:
        import torch

        from sgl_inkling.managers.scheduler import Scheduler

        torch.set_grad_enabled(False)
        if server_args.random_seed is not None:
            torch.manual_seed(server_args.random_seed)
        sched = Scheduler(server_args, model_path, addrs["scheduler"], addrs["detokenizer"])
    except BaseException as e:  # report load failures to the parent instead of hanging it
        pipe.send({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return
    pipe.send(sched.ready_info())
    sched.event_loop()


def _run_detokenizer(server_args, addrs: dict) -> None:
    die_with_parent()
    configure_logging(server_args.log_level)
    from sgl_inkling.managers.detokenizer_manager import DetokenizerManager

    DetokenizerManager(server_args.tokenizer_path, addrs["detokenizer"], addrs["tokenizer"]).event_loop()


def start_backend(server_args, model_path: str) -> Backend:
    """Spawn the children (spawn context: no inherited CUDA or thread state) and wait for ready."""
    ctx = mp.get_context("spawn")
    addrs = ipc_addresses(["scheduler", "detokenizer", "tokenizer"])
    reader, writer = ctx.Pipe(duplex=False)
    sched = ctx.Process(
        target=_run_scheduler, args=(server_args, model_path, addrs, writer), name="scheduler", daemon=True
    )
    detok = ctx.Process(target=_run_detokenizer, args=(server_args, addrs), name="detokenizer", daemon=True)
    sched.start()
    detok.start()
    backend = Backend(info={}, addrs=addrs, procs=[sched, detok])
    while not reader.poll(1.0):
        if not sched.is_alive():
            backend.shutdown()
            raise RuntimeError(f"the scheduler process exited with code {sched.exitcode} while loading")
    info = reader.recv()
    if "error" in info:
        backend.shutdown()
        logger.error("scheduler failed to start:\n%s", info["traceback"])
        raise RuntimeError(f"the scheduler failed to start: {info['error']}")
    backend.info = info
    return backend
