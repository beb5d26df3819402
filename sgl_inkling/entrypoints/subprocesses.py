"""Start the scheduler and detokenizer processes and wait until the model is loaded."""

from __future__ import annotations

import logging
import multiprocessing as mp
import traceback
from dataclasses import dataclass

from sgl_inkling.distributed.launch import GroupReady, dist_init_method, local_tp_ranks
from sgl_inkling.entrypoints.gc_control import freeze_after_startup, warn_long_collections
from sgl_inkling.managers.subprocess_utils import (
    configure_logging,
    die_with_parent,
    ipc_addresses,
    ipc_dir,
    limit_host_threads,
    name_process,
    remove_ipc_dir,
)

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
                p.join(timeout=10)  # gone before returning: a GPU process still exiting holds its memory
        remove_ipc_dir(ipc_dir(self.addrs["scheduler"]))  # an Engine shut down in a long-lived process leaves none behind


def _run_scheduler(
    server_args, model_path: str, recv_addr: str, send_addr: str, gpu_id: int, pipe, rank: int = 0,
    init_method: str | None = None,
) -> None:  # fmt: skip
    die_with_parent()
    name_process(f"sgl-sched-tp{rank}")
    configure_logging(server_args.log_level)
    try:
        import torch

        from sgl_inkling.distributed.launch import build_scheduler

        torch.set_grad_enabled(False)
        if server_args.resolved_device() == "cuda":
            torch.cuda.set_device(gpu_id)  # "cuda" tensors, graphs and memory sizing then use this GPU
        if server_args.random_seed is not None:
            torch.manual_seed(server_args.random_seed)
        sched = build_scheduler(server_args, model_path, recv_addr, send_addr, rank, init_method, gpu_id)
        # After loading, which may transform weights on the CPU with every thread.
        threads = limit_host_threads(server_args.resolved_device())
        if threads is not None:
            logger.info("torch CPU threads: %d (the model runs on the GPU; OMP_NUM_THREADS overrides)", threads)
    except BaseException as e:  # report load failures to the parent instead of hanging it
        pipe.send({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return
    warn_long_collections(server_args.gc_warning_threshold_secs, "scheduler")
    freeze_after_startup("scheduler")
    pipe.send(sched.ready_info())
    sched.event_loop()


def _run_dp_controller(server_args, recv_addr: str, replica_in: list, replica_out: list, detok: str) -> None:
    die_with_parent()
    name_process("sgl-dp-control")
    configure_logging(server_args.log_level)
    from sgl_inkling.managers.data_parallel_controller import DataParallelController

    n, method = server_args.dp_size, server_args.load_balance_method
    DataParallelController(n, method, recv_addr, replica_in, replica_out, detok).event_loop()


def _start_scheduler_group(ctx, server_args, model_path: str, recv_addr: str, send_addr: str, dp_rank: int):
    """One replica: the scheduler process(es) that serve requests from recv_addr and send outputs to
    send_addr, one per TP rank on this node. Returns the processes and the pipe the group reports
    ready (or its load error) on."""
    method = dist_init_method(server_args) if server_args.tp_size > 1 else None
    ranks = local_tp_ranks(server_args)
    procs, readers = [], []
    for i, rank in enumerate(ranks):
        reader, writer = ctx.Pipe(duplex=False)
        gpu_id = dp_rank * len(ranks) + i
        name = "scheduler" if server_args.dp_size == 1 else f"scheduler-dp{dp_rank}"
        name += f"-tp{rank}" if server_args.tp_size > 1 else ""
        args = (server_args, model_path, recv_addr, send_addr, gpu_id, writer, rank, method)
        procs.append(ctx.Process(target=_run_scheduler, args=args, name=name, daemon=True))
        readers.append(reader)
    for p in procs:
        p.start()
    return procs, GroupReady(readers)


def _run_detokenizer(server_args, addrs: dict) -> None:
    die_with_parent()
    name_process("sgl-detokenizer")
    configure_logging(server_args.log_level)
    from sgl_inkling.managers.detokenizer_manager import DetokenizerManager

    detok = DetokenizerManager(server_args.tokenizer_path, addrs["detokenizer"], addrs["tokenizer"])
    warn_long_collections(server_args.gc_warning_threshold_secs, "detokenizer")
    freeze_after_startup("detokenizer")
    detok.event_loop()


def start_backend(server_args, model_path: str, serve: bool = True) -> Backend:
    """Spawn the children (spawn context: no inherited CUDA or thread state) and wait for ready.

    With --dp-size N > 1 a data-parallel controller takes the "scheduler" address and N scheduler
    groups sit behind it; the tokenizer manager and the detokenizer are the same either way.
    serve=False (the other nodes of a multi-node launch): only this node's scheduler ranks.
    """
    ctx = mp.get_context("spawn")
    n = server_args.dp_size
    addrs = ipc_addresses(
        ["scheduler", "detokenizer", "tokenizer"] + [f"dp{i}_{d}" for i in range(n) for d in ("in", "out")]
    )
    procs: list[mp.Process] = []
    if n == 1:
        groups = [(addrs["scheduler"], addrs["detokenizer"])]
    else:
        groups = [(addrs[f"dp{i}_in"], addrs[f"dp{i}_out"]) for i in range(n)]
        ctrl_args = (server_args, addrs["scheduler"], [g[0] for g in groups], [g[1] for g in groups])
        procs.append(
            ctx.Process(
                target=_run_dp_controller,
                args=(*ctrl_args, addrs["detokenizer"]),
                name="dp-controller",
                daemon=True,
            )
        )
        procs[-1].start()
    readers = []
    for rank, (recv_addr, send_addr) in enumerate(groups):
        group, reader = _start_scheduler_group(ctx, server_args, model_path, recv_addr, send_addr, rank)
        procs += group
        readers.append((group, reader))
    if serve:
        procs.append(ctx.Process(target=_run_detokenizer, args=(server_args, addrs), name="detokenizer", daemon=True))
        procs[-1].start()
    backend = Backend(info={}, addrs=addrs, procs=procs)
    infos = [_wait_ready(backend, group, reader) for group, reader in readers]
    backend.info = {
        **infos[0],
        "dp_size": n,
    }  # replicas are identical; per-replica state is in internal_states
    return backend


def _wait_ready(backend: Backend, group: list[mp.Process], reader) -> dict:
    while not reader.poll(1.0):
        dead = [p for p in group if not p.is_alive()]
        if dead:
            backend.shutdown()
            raise RuntimeError(f"the {dead[0].name} process exited with code {dead[0].exitcode} while loading")
    info = reader.recv()
    if "error" in info:
        backend.shutdown()
        logger.error("scheduler failed to start:\n%s", info["traceback"])
        raise RuntimeError(f"the scheduler failed to start: {info['error']}")
    return info
