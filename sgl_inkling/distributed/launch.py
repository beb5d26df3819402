"""Scheduler processes of a TP group: one per rank, on this node's share of the ranks.

Multi-node (SGLang's flags): `--nnodes N --node-rank i --dist-init-addr host:port` on every node;
node i runs TP ranks [i*tp/N, (i+1)*tp/N) on its local GPUs 0..tp/N-1. Only node 0 serves HTTP; its
rank 0 receives the requests and broadcasts them to every rank (see tp_scheduler).
"""

from __future__ import annotations

import socket
import sys
import time
from multiprocessing.connection import Connection


def local_tp_ranks(server_args) -> list[int]:
    per_node = server_args.tp_size // server_args.nnodes
    return list(range(server_args.node_rank * per_node, (server_args.node_rank + 1) * per_node))


def dist_init_method(server_args) -> str:
    if server_args.dist_init_addr:
        return f"tcp://{server_args.dist_init_addr}"
    with socket.socket() as s:  # one node: any free local port
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def build_scheduler(
    server_args, model_path: str, recv_addr: str, send_addr: str, rank: int, init_method: str | None, gpu_id: int
):
    """In a scheduler process: join the TP group (if any) on GPU gpu_id, then build the rank's scheduler."""
    if server_args.tp_size == 1:
        from sgl_inkling.managers.scheduler import Scheduler

        return Scheduler(server_args, model_path, recv_addr, send_addr)
    from sgl_inkling.distributed.parallel_state import init_distributed
    from sgl_inkling.distributed.tp_scheduler import TPScheduler

    device = server_args.resolved_device()
    init_distributed(server_args.tp_size, rank, server_args.ep_size, init_method, device, gpu_id)
    return TPScheduler(server_args, model_path, recv_addr, send_addr)


class GroupReady:
    """The ready pipes of a group's ranks, read like one: ready when every rank has reported, and
    the first error any rank reports wins (rank 0's info otherwise)."""

    def __init__(self, readers: list[Connection]):
        self.readers = readers
        self.msgs: dict[int, dict] = {}

    def poll(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            for i, r in enumerate(self.readers):
                if i not in self.msgs and r.poll(0):
                    self.msgs[i] = r.recv()
            if len(self.msgs) == len(self.readers) or any("error" in m for m in self.msgs.values()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def recv(self) -> dict:
        self.poll(float("inf"))
        errors = [m for m in self.msgs.values() if "error" in m]
        return errors[0] if errors else self.msgs[0]


def serve_ranks_only(server_args, model_path: str) -> int:
    """A node other than 0: run this node's TP ranks until one exits; returns the exit status."""
    import logging

    from sgl_inkling.entrypoints.subprocesses import start_backend

    try:
        backend = start_backend(server_args, model_path, serve=False)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    logging.getLogger(__name__).info("node %d: TP ranks ready, following node 0", server_args.node_rank)
    try:
        while backend.alive():
            time.sleep(1.0)
    finally:
        backend.shutdown()
    return 1  # a rank exited: the group cannot go on without it
