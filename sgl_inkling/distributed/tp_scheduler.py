"""The scheduler of one TP rank. Rank 0 reads the tokenizer manager's messages and broadcasts them;
every rank handles the same messages in the same order, and since scheduling is a deterministic
function of the messages (and of pool sizes, agreed at start), all ranks build the same batches and
run the same forwards, whose collectives pair up. Only rank 0 sends outputs.

The inputs that are not deterministic are made so: the sampler's seed comes from rank 0, and so
does the seed of torch's global generator (MTP rejection sampling draws from it: ranks that accepted
different drafts would commit different tokens and their next forwards would no longer pair up);
the lpm policy's time-based aging is decided by rank 0 and broadcast.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections.abc import Iterable

import torch
import zmq

from sgl_inkling.distributed.parallel_state import get_parallel
from sgl_inkling.distributed.sync import broadcast_object, gather_object
from sgl_inkling.managers.schedule_policy import LPM_MIN_QUEUE
from sgl_inkling.managers.scheduler import Scheduler
from sgl_inkling.managers.subprocess_utils import ipc_addresses, ipc_dir, remove_ipc_dir


class _Discard:
    """The output socket of a follower rank: rank 0 alone answers."""

    def send_pyobj(self, obj, flags: int = 0) -> None:
        pass


class _LeaderOrder:
    """Admission order as rank 0's policy decides it (lpm ages requests by wall-clock time)."""

    def __init__(self, inner):
        self.inner = inner
        self.leader = get_parallel().tp_rank == 0

    def order(self, waiting: Iterable) -> list:
        reqs = list(waiting)
        if self.inner.name != "lpm" or len(reqs) < LPM_MIN_QUEUE:
            return self.inner.order(reqs)  # no clock involved: every rank computes the same
        picks = [reqs.index(r) for r in self.inner.order(reqs)] if self.leader else None
        return [reqs[i] for i in broadcast_object(picks)]


class TPScheduler(Scheduler):
    def __init__(self, server_args, model_path: str, recv_addr: str, send_addr: str):
        self.leader = get_parallel().tp_rank == 0
        seed = server_args.random_seed if server_args.random_seed is not None else random.randrange(2**31)
        server_args = dataclasses.replace(server_args, random_seed=broadcast_object(seed))
        if not self.leader:  # private endpoints nobody talks to; the output one is replaced below
            recv_addr = send_addr = ipc_addresses(["unused"])["unused"]
        super().__init__(server_args, model_path, recv_addr, send_addr)
        if not self.leader:  # its socket file is never looked up: gone now, not left by a killed rank
            remove_ipc_dir(ipc_dir(recv_addr))
        torch.manual_seed(server_args.random_seed)  # after loading: from here on every rank draws alike
        self.policy = _LeaderOrder(self.policy)
        if not self.leader:
            self.send_sock.close(linger=0)
            self.send_sock = _Discard()
        self.output_digest = 0  # every token this rank emitted, folded in order (see internal_state)

    def recv_requests(self, block: bool) -> None:
        msgs = self._read(block) if self.leader else None
        for msg in broadcast_object(msgs):
            self.handle(msg)

    def _read(self, block: bool) -> list:
        msgs, flags = [], 0 if block else zmq.NOBLOCK
        while True:
            try:
                msgs.append(self.recv_sock.recv_pyobj(flags))
            except zmq.Again:
                return msgs
            flags = zmq.NOBLOCK

    def flush_outbox(self) -> None:
        for req in dict.fromkeys(self.outbox):
            self.output_digest = zlib.crc32(repr((req.rid, req.new_tokens)).encode(), self.output_digest)
        super().flush_outbox()

    def internal_state(self) -> dict:
        p, runner = get_parallel(), self.runner
        # Every rank handles this message: compare what each emitted and holds. Ranks that drifted
        # apart run forwards whose collectives mix different tokens, so rank 0's answers go wrong.
        prints = gather_object((self.output_digest, self.kv.stats()))
        return {
            **super().internal_state(),
            "tp_ranks_agree": all(fp == prints[0] for fp in prints),
            "tp_size": p.tp_size,
            "ep_size": p.ep_size,
            # This rank's share of the per-layer state (rank 0 answers; every rank holds the same).
            "sconv_channels": {str(k): list(v) for k, v in runner.model.sconv_channels().items()},
            "kv_heads": {"full": runner.full_pool.layout.num_kv_heads, "swa": runner.swa_pool.layout.num_kv_heads},
        }
