"""Eviction by value for the radix cache: thin a cached path before dropping it.

Full KV, sliding KV and conv checkpoints come out of one budget (the pools are sized together,
scheduler_memory.py), and whichever runs short is refilled in order of least value:

1. Thinning: checkpoints inside a path (nodes with children) go first, least recently used first,
   those on a single path before those where paths branch (a later divergence resumes exactly at
   a branch point). Thinning frees the checkpoint, and then the sliding KV that only its window
   needed. Locked nodes keep the sliding KV their running requests can still read: a request
   locked at prefix end e reads no position below e - window + 1 again (the request's own window,
   which the no-cache path frees below at the same point). When sliding KV is short, locked paths
   then lose the checkpoints whose windows reach below that floor (the 128-token interval inside a
   running prompt), so a running request holds about one window of its prompt, as without the
   cache, instead of all of it; a locked node's own end checkpoint costs nothing and stays. When
   only checkpoint slots are short, locked checkpoints may all go (a running request restored its
   own at admission and never reads it again).
2. Dropping: least recently used unlocked leaves, with their full KV, their sliding KV and their
   end-of-turn checkpoint together. A node left without a checkpoint at or below it is dropped
   with them: KV past the last checkpoint can never be resumed, so it must not hold memory.

Within each step, nodes that a queued request will resume through (`wanted`, marked on arrival) go
last, and among them those of the latest arrival first: evicting LRU in arrival order would make
each follow-up turn in a long queue push out the next one's prefix just before it is admitted.

A sliding-KV slot at position t is kept while some checkpoint q at or below its node has
q - window < t < q (the window a request resuming at q reads), or some request locked at e at or
below its node has e - window < t.
"""

from __future__ import annotations

import heapq
import itertools
import math
import weakref

_ticket = itertools.count()
COUNTERS = (
    "radix_thinned_checkpoints",  # intermediate checkpoints freed while their KV stayed cached
    "radix_thinned_swa_tokens",  # sliding-KV slots freed because no checkpoint needed them any more
    "radix_evicted_nodes",  # tree nodes dropped (with their full KV)
    "radix_evicted_tokens",  # full-KV tokens dropped
    "radix_evicted_end_checkpoints",  # end-of-turn checkpoints dropped together with their KV
)


def wanted_seq(node) -> int | None:
    """Arrival order of the earliest still-queued request that will reuse `node`, else None."""
    w = node.wanted() if node.wanted is not None else None
    return w.wait_seq if w is not None and w.queued else None


def _drop_key(node) -> tuple:
    seq = wanted_seq(node)
    return (0, node.last_access) if seq is None else (1, -seq)


class RadixEviction:
    """Mixin for RadixCache (root, window, full_alloc, swa_alloc, ckpts, _nodes, _along, counters)."""

    def mark_wanted(self, tokens: list[int], req) -> None:
        """Record that a queued request (with `queued` and `wait_seq`) will resume along `tokens`."""
        for node, _ in self._along(tokens):
            seq = wanted_seq(node)
            if seq is None or req.wait_seq < seq:
                node.wanted = weakref.ref(req)  # a finished request is not kept alive by the tree

    def evict(self, full: int = 0, swa: int = 0, ckpts: int = 0) -> None:
        """Free cache memory until the allocators have the asked-for room (or nothing unlocked is left)."""

        def short_thinnable() -> bool:
            return self.swa_alloc.available < swa or self.ckpts.available < ckpts

        def short() -> bool:
            return self.full_alloc.available < full or short_thinnable()

        if not short():
            return
        self._lock_ends = None  # filled on first use: locks do not change while evicting
        if short_thinnable():
            self._prune_deferred()  # windows kept only because their node was locked when thinned
            if short_thinnable():
                self._thin(short_thinnable, locked=self.ckpts.available < ckpts)
        if short():
            self._drop_leaves(short)
        self._lock_ends = None

    # ---------------------------------------------------------------- thinning

    def _thin(self, need, locked: bool) -> None:
        """Thin checkpoints until `need()` is met. Locked nodes: every one when `locked` (checkpoint
        slots are short), else only those whose window reaches below their running requests' floor
        (the rest cost no sliding KV: thinning them would strip running paths of their checkpoints
        for nothing, and a request retracted from such a path would resume from nowhere), after the
        unlocked ones, lowest first (the floor then rises one interval a checkpoint)."""
        candidates = [
            n for n in self._nodes()
            if n.ckpt is not None and n.children and n is not self.root
            and (locked or n.lock_ref == 0 or n.end < self._lowest_lock_end(n))
        ]  # fmt: skip
        candidates.sort(
            key=lambda n: (
                not locked and n.lock_ref > 0, wanted_seq(n) is not None, len(n.children) > 1, n.last_access, n.end
            )
        )
        for node in candidates:
            self.ckpts.free(node.ckpt)
            node.ckpt = None
            self.counters["radix_thinned_checkpoints"] += 1
            self._prune_up(node, node.end)
            if not need():
                return

    def _nearest_ckpt(self, node, limit: int) -> float:
        """Smallest checkpoint position at or below `node`, ignoring those at or past `limit`."""
        if node.ckpt is not None:
            return node.end
        if node.end >= limit:
            return math.inf
        return min((self._nearest_ckpt(c, limit) for c in node.children.values()), default=math.inf)

    def _lowest_lock_end(self, node) -> float:
        """The shallowest prefix end at or below `node` where a request holds its lock (the lock
        count a node has beyond its children's), else inf. Computed for every node in one pass per
        evict call (children before parents): asked per candidate and per pruned node, a walk down
        each locked path cost 119 ms a decode step with 60 running 8K-token prompts on a CPU."""
        if self._lock_ends is None:
            ends: dict[int, float] = {}
            for n in reversed(self._nodes()):  # _nodes lists every parent before its children
                kids = n.children.values()
                if n.lock_ref > sum(c.lock_ref for c in kids):
                    ends[id(n)] = n.end
                else:
                    ends[id(n)] = min((ends[id(c)] for c in kids if c.lock_ref > 0), default=math.inf)
            self._lock_ends = ends
        return self._lock_ends[id(node)]

    def _prune_node(self, node) -> None:
        """Free the node's sliding KV that neither a checkpoint's window nor a running request reads."""
        if node is self.root:
            return
        keep_from = self._nearest_ckpt(node, node.end + self.window) - self.window + 1
        if node.lock_ref > 0:
            # A request locked at e has kv_len >= e and reads only its window before kv_len again.
            keep_from = min(keep_from, self._lowest_lock_end(node) - self.window + 1)
            self._prune_later.add(node)  # more goes once it is unlocked
        else:
            self._prune_later.discard(node)
        start = node.end - len(node.key)
        cut = int(min(max(keep_from - start, 0), len(node.key)))
        if cut == 0:
            return
        seg = node.swa[:cut]
        live = seg != 0
        n = int(live.sum())
        if n:
            self.swa_alloc.free(seg[live])
            seg[live] = 0
            self.counters["radix_thinned_swa_tokens"] += n

    def _prune_up(self, node, pos: int) -> None:
        """Prune the nodes holding the window before position `pos` (its checkpoint just went)."""
        while node is not None and node is not self.root and node.end > pos - self.window + 1:
            self._prune_node(node)
            node = node.parent

    def _prune_deferred(self) -> None:
        for node in list(self._prune_later):
            if node.parent is None:  # dropped since
                self._prune_later.discard(node)
            else:
                self._prune_node(node)

    # ---------------------------------------------------------------- dropping

    def _drop_leaves(self, need) -> None:
        heap = [(_drop_key(n), next(_ticket), n) for n in self._nodes() if self._droppable(n)]
        heapq.heapify(heap)
        while heap and need():
            _, _, node = heapq.heappop(heap)
            if node.parent is None or not self._droppable(node):
                continue  # already dropped, or changed since it was queued
            parent = self._drop(node)
            while parent is not self.root and self._droppable(parent) and parent.ckpt is None:
                parent = self._drop(parent)  # KV past the last checkpoint is unresumable
            if parent is not self.root:
                self._prune_up(parent, node.end)
                if self._droppable(parent):
                    heapq.heappush(heap, (_drop_key(parent), next(_ticket), parent))

    def _droppable(self, node) -> bool:
        return node is not self.root and not node.children and node.lock_ref == 0

    def _drop(self, node):
        """Remove a leaf with everything it holds; returns its parent."""
        if node.ckpt is not None:
            self.counters["radix_evicted_end_checkpoints"] += 1
        self._free_node(node)
        self.counters["radix_evicted_nodes"] += 1
        self.counters["radix_evicted_tokens"] += len(node.key)
        parent = node.parent
        del parent.children[node.key[0]]
        node.parent = None
        return parent

    def _free_node(self, node) -> None:
        self.full_alloc.free(node.full)
        live = node.swa[node.swa != 0]
        if live.numel():
            self.swa_alloc.free(live)
        if node.ckpt is not None:
            self.ckpts.free(node.ckpt)
            node.ckpt = None
