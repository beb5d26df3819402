"""Fill the token bitmask of a batch on the CPU and apply it to the logits in place.

The bitmask is xgrammar's packed int32 form (1 bit per token, ceil(V/32) words a row), 32x smaller
than a bool mask: on CUDA it is filled in pinned memory while the device still runs the forward
(kernel launches are asynchronous and nothing here syncs), copied without blocking and applied by
xgrammar's kernel; on the CPU a vectorised unpack-and-fill does it (see _apply_on_cpu). Rows
without an active grammar are skipped entirely, so unconstrained requests in a mixed batch pay
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import xgrammar as xgr

from sgl_inkling.constrained.matcher import RequestGrammar


class GrammarMasker:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._host: torch.Tensor | None = None  # reused across steps; grows with the batch
        self._kernel: str | None = None

    def _buffer(self, rows: int, device: torch.device) -> torch.Tensor:
        if self._host is None or self._host.shape[0] < rows:
            shape = xgr.get_bitmask_shape(max(rows, 8), self.vocab_size)
            pin = device.type == "cuda"
            self._host = torch.empty(shape, dtype=xgr.bitmask_dtype, pin_memory=pin)
        return self._host[:rows]

    def fill(
        self, grammars: Sequence[RequestGrammar | None], device: torch.device
    ) -> tuple[torch.Tensor, list[int]]:
        """The host bitmask of the batch and the rows it constrains (others are left stale)."""
        rows = [i for i, g in enumerate(grammars) if g is not None and g.active]
        bitmask = self._buffer(len(grammars), device)
        for i in rows:
            grammars[i].fill(bitmask, i)  # type: ignore[union-attr]
        return bitmask, rows

    def apply(self, grammars: Sequence[RequestGrammar | None], logits: torch.Tensor) -> list[int]:
        """Mask logits [B, V] in place: disallowed tokens become -inf. Returns the masked rows."""
        if not any(g is not None for g in grammars):
            return []
        bitmask, rows = self.fill(grammars, logits.device)
        if not rows:
            return rows
        if logits.device.type != "cpu":
            bitmask = bitmask.to(logits.device, non_blocking=True)
        self._apply_kernel(logits, bitmask, rows)
        return rows

    def warm_up(self, device: torch.device, max_rows: int) -> None:
        """Compile xgrammar's Triton mask kernel for what serving calls it with (all rows, or a list
        of rows; row counts of 1, a multiple of 16 and others, which Triton compiles apart), so the
        first constrained request waits for no compile (jit_watch reported one after warm-up)."""
        if device.type != "cuda":
            return
        from sgl_inkling_kernels.jit_watch import warming_up

        n = max(max_rows, 2)
        logits = torch.zeros(n, self.vocab_size, dtype=torch.float32, device=device)
        bitmask = torch.full(xgr.get_bitmask_shape(n, self.vocab_size), -1, dtype=xgr.bitmask_dtype, device=device)
        with warming_up():
            for rows in {1, 2, min(16, n), n}:
                self._apply_kernel(logits[:rows], bitmask[:rows], list(range(rows)))  # every row
                self._apply_kernel(logits, bitmask, list(range(rows)))  # some rows (indices)
        torch.cuda.synchronize(device)
        del logits, bitmask
        torch.cuda.empty_cache()  # memory left cached would count as used when later stages size graphs

    def _apply_kernel(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        if logits.device.type == "cpu":
            _apply_on_cpu(logits, bitmask, rows, self.vocab_size)
            return
        indices = None if len(rows) == logits.shape[0] else rows
        kernel = self._kernel or "triton"
        try:
            xgr.apply_token_bitmask_inplace(
                logits, bitmask, vocab_size=self.vocab_size, indices=indices, backend=kernel
            )
        except (ImportError, RuntimeError):
            if kernel == "torch_native":
                raise
            # No usable Triton on this device: xgrammar's plain torch version is slower but exact.
            kernel = "torch_native"
            xgr.apply_token_bitmask_inplace(
                logits, bitmask, vocab_size=self.vocab_size, indices=indices, backend=kernel
            )
        self._kernel = kernel


def _apply_on_cpu(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], vocab_size: int) -> None:
    # numpy unpacks the bits and torch fills in one vectorised pass: about 1.5x faster than
    # xgrammar's CPU kernel (a per-token bit test) at batch 64 over Inkling's 200k vocabulary.
    forbid = unpack_bitmask(bitmask[rows], vocab_size).logical_not_()
    if len(rows) == logits.shape[0]:
        logits[:, :vocab_size].masked_fill_(forbid, float("-inf"))
        return
    for j, i in enumerate(rows):
        logits[i, :vocab_size].masked_fill_(forbid[j], float("-inf"))


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A packed bitmask [B, ceil(V/32)] as a bool mask [B, V] (True = allowed), on the CPU; for tests
    and tools (numpy's unpackbits is ~100x faster than doing the shifts in torch here)."""
    as_bytes = bitmask.detach().cpu().contiguous().numpy().view(np.uint8)  # little-endian words
    bits = np.unpackbits(as_bytes, axis=-1, bitorder="little")[:, :vocab_size]
    return torch.from_numpy(bits.view(np.bool_))
