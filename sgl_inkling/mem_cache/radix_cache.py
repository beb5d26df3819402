"""Radix tree over token ids holding full KV, sliding-window KV and short-conv checkpoints.

A request can resume at prefix length p only with the full KV of [0, p), the sliding KV of the
window before p and the conv window at p. Nodes end where checkpoints were taken (prefill chunk
ends, divergence points, ends of finished requests); matching walks to the longest shared prefix
m and resumes at the deepest node end c <= m that has all three, so the request recomputes only
[c, m) and a later request finds a checkpoint at m. Sliding KV is kept only in the window before
each checkpoint (0 marks a dropped slot). Eviction by value lives in radix_eviction.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from sgl_inkling.mem_cache.memory_pool import TokenSlotAllocator
from sgl_inkling.mem_cache.radix_eviction import COUNTERS, RadixEviction
from sgl_inkling.mem_cache.sconv_checkpoints import SConvCheckpointPool


class TreeNode:
    __slots__ = ("key", "full", "swa", "ckpt", "children", "parent", "lock_ref", "last_access", "end", "wanted")

    def __init__(self, key, full, swa, parent, end):
        self.key: list[int] = key
        self.full: torch.Tensor = full  # [len(key)] slots in the full KV pool
        self.swa: torch.Tensor = swa  # [len(key)] slots in the sliding KV pool, 0 = dropped
        self.ckpt: int | None = None  # conv checkpoint at this node's end
        self.children: dict[int, TreeNode] = {}
        self.parent: TreeNode | None = parent
        self.lock_ref = 0
        self.last_access = time.monotonic()
        self.end = end  # prefix length at the end of this node
        self.wanted = None  # the earliest queued request that will resume through this node


@dataclass(frozen=True)
class MatchResult:
    resume_len: int  # c: where the request starts computing
    matched_len: int  # m: longest shared prefix (c < m means a checkpoint is missing at m)
    node: TreeNode  # node ending at c (lock it while the request uses the prefix)
    full: torch.Tensor  # [c] full-KV slots
    swa: torch.Tensor  # [c] sliding-KV slots (valid in the window before c)
    ckpt: int | None  # conv checkpoint at c (None when c == 0)


def common_prefix_len(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the common prefix of `a` and `b[start:]` (without copying b's tail per call)."""
    n = min(len(a), len(b) - start)
    if a[:n] == b[start : start + n]:  # the usual case on a cached path, at C speed
        return n
    i = 0
    while a[i] == b[start + i]:
        i += 1
    return i


class RadixCache(RadixEviction):
    def __init__(
        self,
        full: TokenSlotAllocator,
        swa: TokenSlotAllocator,
        ckpts: SConvCheckpointPool,
        window: int,
    ):
        self.full_alloc, self.swa_alloc, self.ckpts, self.window = full, swa, ckpts, window
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.reset()

    def reset(self) -> None:
        empty = torch.empty(0, dtype=torch.int64)
        self.root = TreeNode([], empty, empty, None, 0)
        self.root.lock_ref = 1  # never evicted
        self._prune_later: set[TreeNode] = set()  # locked when their sliding KV became unneeded
        self._lock_ends: dict[int, float] | None = None  # per evict call (radix_eviction.py)

    # ---------------------------------------------------------------- structure

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Cut `child` after `at` tokens; the new upper part becomes child's parent."""
        parent = child.parent
        upper = TreeNode(child.key[:at], child.full[:at], child.swa[:at], parent, parent.end + at)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.wanted = child.wanted
        child.key, child.full, child.swa = child.key[at:], child.full[at:], child.swa[at:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        return upper

    def _walk(self, tokens: list[int]) -> list[TreeNode]:
        """Path from the root along `tokens`, splitting the last node at the divergence point."""
        node, pos, path = self.root, 0, [self.root]
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = common_prefix_len(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            node, pos = child, pos + n
            path.append(node)
        return path

    @staticmethod
    def _concat(path: list[TreeNode], attr: str) -> torch.Tensor:
        parts = [getattr(n, attr) for n in path[1:]]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)

    # ---------------------------------------------------------------- match and insert

    def _along(self, tokens: list[int]) -> Iterator[tuple[TreeNode, int]]:
        """Nodes of the longest cached prefix of `tokens` (the last may match only in part), each
        with the prefix length matched through it; the tree is not changed."""
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                return
            n = common_prefix_len(child.key, tokens, pos)
            pos += n
            yield child, pos
            if n < len(child.key):
                return
            node = child

    def peek(self, tokens: list[int]) -> int:
        """Length of the longest cached prefix of `tokens`, without changing the tree."""
        return max((pos for _, pos in self._along(tokens)), default=0)

    def match(self, tokens: list[int]) -> MatchResult:
        """Deepest resumable point for `tokens`; at least the last token is always left to compute."""
        path = self._walk(tokens)
        matched = path[-1].end
        full, swa = self._concat(path, "full"), self._concat(path, "swa")
        now = time.monotonic()
        for node in reversed(path):
            c = node.end
            if c > len(tokens) - 1:
                continue
            if c == 0:
                break
            lo = max(0, c - self.window + 1)
            if node.ckpt is not None and bool((swa[lo:c] != 0).all()):
                for n in path[: path.index(node) + 1]:
                    n.last_access = now
                return MatchResult(c, matched, node, full[:c], swa[:c], node.ckpt)
        empty = torch.empty(0, dtype=torch.int64)
        return MatchResult(0, matched, self.root, empty, empty, None)

    def insert(
        self,
        tokens: list[int],
        full: torch.Tensor,
        swa: torch.Tensor,
        ckpt: int | None,
        inner_ckpts: dict[int, int] | None = None,
    ) -> TreeNode:
        """Adopt a request's prefix, with a conv checkpoint at its end and at `inner_ckpts` positions.

        Slots duplicating cached ones are freed, so the caller must re-read the slots of its prefix
        from the returned node (`slots_of`) and must not insert the same slots again.
        """
        node, pos = self.root, 0
        now = time.monotonic()
        cached: list[TreeNode] = []  # the nodes the prefix already had, in path order
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                child = TreeNode(
                    tokens[pos:], full[pos:].clone(), swa[pos:].clone(), node, node.end + len(tokens) - pos
                )
                node.children[tokens[pos]] = child
                node, pos = child, len(tokens)
                break
            n = common_prefix_len(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            cached.append(child)
            node, pos = child, pos + n
            node.last_access = now
        node.last_access = now
        if cached:
            self._absorb(cached, full[: cached[-1].end], swa[: cached[-1].end])
        self._attach_ckpt(node, ckpt)
        self._attach_inner(tokens, inner_ckpts or {})
        return node

    def _attach_inner(self, tokens: list[int], inner: dict[int, int]) -> None:
        """Checkpoints at positions inside the path of `tokens` (just inserted, so it matches):
        one descent, splitting the node that holds each position so that a node ends there."""
        node, pos = self.root, 0
        for p, slot in sorted(inner.items()):
            while True:
                child = node.children[tokens[pos]]
                end = pos + len(child.key)
                if end >= p:
                    break
                node, pos = child, end
            if end > p:
                child = self._split(child, p - pos)
            self._attach_ckpt(child, slot)
            node, pos = child, p

    def _attach_ckpt(self, node: TreeNode, slot: int | None) -> None:
        if slot is None:
            return
        if node.ckpt is None and node is not self.root:
            node.ckpt = slot
        else:
            self.ckpts.free(slot)  # an equal snapshot is already there

    def _absorb(self, path: list[TreeNode], full: torch.Tensor, swa: torch.Tensor) -> None:
        """Take a request's slots for the cached path `path` (from the root): its full slots that
        duplicate the tree's are freed, its sliding slots fill the tree's dropped ones (0) and the
        rest of them are freed. One pass over the whole path: a finished 8K-token request's path
        has some 70 checkpoint nodes, and a pass per node cost milliseconds of host time."""
        tree_full = self._concat([self.root, *path], "full")
        dup = full != tree_full
        if bool(dup.any()):
            self.full_alloc.free(full[dup])
        tree_swa = self._concat([self.root, *path], "swa")
        fill = (tree_swa == 0) & (swa != 0)
        extra = (swa != 0) & ~fill & (swa != tree_swa)
        if bool(extra.any()):
            self.swa_alloc.free(swa[extra])
        at = fill.nonzero().flatten()
        if at.numel():  # write into the nodes that had dropped slots (few: those in the request's window)
            first, last = int(at[0]), int(at[-1])
            for node in path:
                lo = node.end - len(node.key)
                if node.end > first and lo <= last:
                    seg = fill[lo : node.end]
                    node.swa[seg] = swa[lo : node.end][seg]

    def slots_of(self, node: TreeNode) -> tuple[torch.Tensor, torch.Tensor]:
        """Full and sliding slots of the prefix ending at `node`."""
        path = []
        while node is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        return self._concat(path, "full"), self._concat(path, "swa")

    # ---------------------------------------------------------------- locking

    def lock(self, node: TreeNode) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node is not None:
            node.lock_ref -= 1
            node = node.parent

    def _nodes(self) -> list[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def flush(self) -> None:
        for node in self._nodes():
            if node is not self.root:
                self._free_node(node)
        self.reset()

    def stats(self) -> dict[str, int]:
        nodes = self._nodes()[1:]
        n_ckpts = sum(n.ckpt is not None for n in nodes)
        per_ckpt = self.ckpts.bytes_per_checkpoint()
        return {
            "radix_cached_tokens": sum(len(n.key) for n in nodes),
            "radix_swa_tokens": sum(int((n.swa != 0).sum()) for n in nodes),
            "radix_checkpoints": n_ckpts,
            "radix_checkpoint_bytes": n_ckpts * per_ckpt,
            "radix_nodes": len(nodes),
            **self.counters,
            "sconv_checkpoint_bytes": per_ckpt,
            "sconv_checkpoints_available": self.ckpts.available,
            "sconv_checkpoints_total": self.ckpts.size,
        }
