"""The data-parallel controller (`--dp-size N`): one process between the tokenizer manager and N
replicas, each a scheduler group with its own model and pools.

It takes the place of the single scheduler on the tokenizer manager's socket, so the HTTP process
does not know how many replicas there are:
- a generate request goes to one replica (round robin, or the one with the fewest requests in flight);
- an abort goes to the replica that holds the request (all of them for abort_all);
- flush_cache and get_internal_state go to every replica, and their N replies become one.
Replica outputs pass through here on their way to the detokenizer (forwarded as the raw pickled
frames, never re-encoded), which is how the controller learns that a request finished.
"""

from __future__ import annotations

import logging
import pickle
from collections import deque
from dataclasses import dataclass, field

import zmq

from sgl_inkling.managers import io_struct as io

logger = logging.getLogger(__name__)

# Per-replica values that describe the model, not capacity or traffic: never summed.
_SHARED_KEYS = {
    "context_len",
    "vocab_size",
    "sconv_checkpoint_bytes",
    "sconv_checkpoint_interval",
    "sliding_window_size",
    "full_kv_bytes_per_token",
    "swa_kv_bytes_per_token",
}


def check_dp_rank(rank, dp_size: int) -> int | None:
    """Validate a request's data_parallel_rank in the HTTP process, so a bad one is a 400."""
    if rank is None:
        return None
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < dp_size:
        raise io.RequestError(f"'data_parallel_rank' must be an integer in [0, {dp_size}), got {rank!r}")
    return rank


def merge_states(states: list[dict]) -> dict:
    """One view of N replicas: counters and capacities summed, model facts from replica 0, and each
    replica's own state under "replicas" (tagged with its dp_rank)."""
    merged: dict = {}
    for key, value in states[0].items():
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if numeric and key not in _SHARED_KEYS:
            merged[key] = sum(s.get(key, 0) for s in states)
        else:
            merged[key] = value
    merged["dp_size"] = len(states)
    merged["replicas"] = [{**s, "dp_rank": i} for i, s in enumerate(states)]
    return merged


def merge_flush(replies: list[io.FlushCacheResp]) -> io.FlushCacheResp:
    failed = [f"replica {i}: {r.message}" for i, r in enumerate(replies) if not r.success]
    return io.FlushCacheResp(not failed, "; ".join(failed))


class LoadBalancer:
    """Which replica takes the next request, and who holds each request until it finishes."""

    def __init__(self, n: int, method: str):
        self.n, self.method = n, method
        self.owner: dict[str, int] = {}  # rid -> replica
        self.in_flight = [0] * n
        self.next_rr = 0

    def assign(self, rid: str, pinned: int | None = None) -> int:
        if pinned is not None:
            i = pinned
        elif self.method == "shortest_queue":
            # Fewest in flight; ties go round robin so equal replicas still alternate.
            order = [(self.next_rr + k) % self.n for k in range(self.n)]
            i = min(order, key=lambda r: self.in_flight[r])
        else:
            i = self.next_rr
        if pinned is None:
            self.next_rr = (i + 1) % self.n
        self.owner[rid] = i
        self.in_flight[i] += 1
        return i

    def finished(self, rid: str) -> None:
        i = self.owner.pop(rid, None)
        if i is not None:
            self.in_flight[i] -= 1


@dataclass
class _Pending:
    """A control request sent to every replica, waiting for all their replies."""

    kind: type
    replies: dict[int, object] = field(default_factory=dict)


class DataParallelController:
    def __init__(
        self,
        n: int,
        method: str,
        recv_addr: str,
        replica_in: list[str],
        replica_out: list[str],
        detok_addr: str,
    ):
        self.n = n
        ctx = zmq.Context.instance()
        self.recv_sock = ctx.socket(zmq.PULL)
        self.recv_sock.bind(recv_addr)
        self.to_replica = []
        for addr in replica_in:
            sock = ctx.socket(zmq.PUSH)
            sock.connect(addr)
            self.to_replica.append(sock)
        self.from_replica = []
        for addr in replica_out:
            sock = ctx.socket(zmq.PULL)
            sock.bind(addr)
            self.from_replica.append(sock)
        self.to_detok = ctx.socket(zmq.PUSH)
        self.to_detok.connect(detok_addr)
        self.balancer = LoadBalancer(n, method)
        self.pending: deque[_Pending] = deque()

    # ---------------------------------------------------------------- dispatch

    def handle_request(self, msg) -> None:
        if isinstance(msg, io.TokenizedGenerateReq):
            i = self.balancer.assign(msg.rid, msg.data_parallel_rank)
            self.to_replica[i].send_pyobj(msg)
        elif isinstance(msg, io.AbortReq):
            if msg.abort_all:
                self.broadcast(msg)
            elif msg.rid in self.balancer.owner:
                self.to_replica[self.balancer.owner[msg.rid]].send_pyobj(msg)
            # else: it already finished; nothing holds it
        elif isinstance(msg, io.FlushCacheReq | io.GetInternalStateReq):
            self.pending.append(_Pending(type(msg)))
            self.broadcast(msg)
        else:
            logger.warning("data-parallel controller ignored unknown message %r", type(msg))

    def broadcast(self, msg) -> None:
        for sock in self.to_replica:
            sock.send_pyobj(msg)

    # ---------------------------------------------------------------- replies

    def handle_output(self, i: int, raw: bytes) -> None:
        msg = pickle.loads(raw)
        if isinstance(msg, io.BatchTokenOut):
            for rid, reason in zip(msg.rids, msg.finished_reasons):
                if reason is not None:
                    self.balancer.finished(rid)
            self.to_detok.send(raw)
            return
        # A control reply: replicas answer in the order they were asked, so it belongs to the
        # oldest pending request this replica has not answered yet.
        entry = next((p for p in self.pending if i not in p.replies), None)
        if entry is None:
            logger.warning("data-parallel controller dropped an unexpected %r from replica %d", type(msg), i)
            return
        entry.replies[i] = msg
        while self.pending and len(self.pending[0].replies) == self.n:
            done = self.pending.popleft()
            replies = [done.replies[r] for r in range(self.n)]
            if done.kind is io.FlushCacheReq:
                self.to_detok.send_pyobj(merge_flush(replies))
            else:
                self.to_detok.send_pyobj(io.InternalState(merge_states([r.state for r in replies])))

    # ---------------------------------------------------------------- loop

    def event_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.recv_sock, zmq.POLLIN)
        for sock in self.from_replica:
            poller.register(sock, zmq.POLLIN)
        index = {sock: i for i, sock in enumerate(self.from_replica)}
        while True:
            for sock, _ in poller.poll():
                if sock is self.recv_sock:
                    self.handle_request(sock.recv_pyobj())
                else:
                    self.handle_output(index[sock], sock.recv())
