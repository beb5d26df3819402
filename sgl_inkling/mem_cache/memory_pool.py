"""Device memory pools: req-to-token tables, paged KV (full and sliding layers apart), short-conv state.

Slot 0 of every KV pool is a padding slot that is never handed out, so padded batch entries can
write there harmlessly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_inkling.sampling.host_copy import to_device


class ReqToTokenPool:
    """Row per running request: position -> KV slot, one table per attention kind.

    The row index also names the request's short-conv state slot.
    """

    def __init__(self, size: int, max_context_len: int, device: torch.device | str):
        self.size = size
        self.max_context_len = max_context_len
        # One extra row, never handed out, for the padded entries of CUDA-graph batches (all slot 0).
        self.pad_row = size
        self.full = torch.zeros(size + 1, max_context_len, dtype=torch.int64, device=device)
        self.swa = torch.zeros(size + 1, max_context_len, dtype=torch.int64, device=device)
        # Host mirrors: the scheduler's bookkeeping reads slots from here, never from the device
        # (a device read would sync with the GPU once per request per decode step).
        on_host = self.full.device.type == "cpu"
        self.host = {
            "full": self.full if on_host else torch.zeros(size + 1, max_context_len, dtype=torch.int64),
            "swa": self.swa if on_host else torch.zeros(size + 1, max_context_len, dtype=torch.int64),
        }
        self._free = list(range(size))

    def write(self, kind: str, row: int, start: int, slots: torch.Tensor) -> None:
        """Set positions [start, start + len(slots)) of a row in the `kind` ("full"/"swa") table."""
        host = self.host[kind]
        end = start + slots.numel()
        host[row, start:end] = slots
        device = self.full if kind == "full" else self.swa
        if device is not host:
            # Staged in pinned memory: a copy from pageable memory may wait for the stream (CUDA's
            # API sync rules), i.e. for the forward in flight, every decode step, per request.
            device[row, start:end] = to_device(host[row, start:end], torch.int64, device.device)

    def write_points(self, rows: torch.Tensor, positions: torch.Tensor, slots: dict[str, torch.Tensor]) -> None:
        """Set entry (rows[i], positions[i]) of each named table ("full" / "swa") to its slots[i] (host
        int64 tensors), all in one staged copy: a decode step's one new slot per request in both
        tables, where a write per request cost a pinned staging buffer, a copy and an indexed store
        each (milliseconds at batch 64)."""
        for kind, values in slots.items():
            self.host[kind][rows, positions] = values
        if self.full is not self.host["full"]:
            packed = to_device(torch.stack([rows, positions, *slots.values()]), torch.int64, self.full.device)
            for i, kind in enumerate(slots):
                (self.full if kind == "full" else self.swa)[packed[0], packed[1]] = packed[2 + i]

    def read(self, kind: str, row: int, start: int, end: int) -> torch.Tensor:
        """Slots of positions [start, end) of a row, from the host mirror (a view)."""
        return self.host[kind][row, start:end]

    def read_points(self, kind: str, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Slots at entries (rows[i], positions[i]), from the host mirror (a copy)."""
        return self.host[kind][rows, positions]

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, idx: int) -> None:
        self._free.append(idx)

    @property
    def available(self) -> int:
        return len(self._free)


class TokenSlotAllocator:
    """Free list over the slots of one KV pool (slot 0 reserved). A bitmap catches double frees,
    which would otherwise hand one slot to two owners and silently corrupt the cache."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = torch.arange(1, num_slots + 1, dtype=torch.int64)
        self._n_free = num_slots
        self._is_free = torch.ones(num_slots + 1, dtype=torch.bool)
        self._is_free[0] = False

    @property
    def available(self) -> int:
        return self._n_free

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self._n_free:
            return None
        out = self._free[self._n_free - n : self._n_free].clone()
        self._n_free -= n
        self._is_free[out] = False
        return out

    def free(self, slots: torch.Tensor) -> None:
        slots = slots.to("cpu", torch.int64).flatten()
        n = slots.numel()
        if n == 0:
            return
        if bool(self._is_free[slots].any()) or slots.unique().numel() != n:
            raise RuntimeError("KV slot double free (or the padding slot)")
        self._is_free[slots] = True
        self._free[self._n_free : self._n_free + n] = slots
        self._n_free += n


@dataclass(frozen=True)
class KVLayout:
    num_kv_heads: int
    head_dim: int


class KVPool:
    """K and V buffers [num_slots + 1, kv_heads, head_dim] for each layer of one attention kind."""

    def __init__(
        self,
        num_slots: int,
        layer_ids: list[int],
        layout: KVLayout,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.num_slots = num_slots
        self.layout = layout
        self.allocator = TokenSlotAllocator(num_slots)
        shape = (num_slots + 1, layout.num_kv_heads, layout.head_dim)
        self._index = {layer: i for i, layer in enumerate(layer_ids)}
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in layer_ids]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in layer_ids]

    def buffers(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._index[layer_id]
        return self.k[i], self.v[i]

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        kb, vb = self.buffers(layer_id)
        kb[loc] = k.to(kb.dtype)
        vb[loc] = v.to(vb.dtype)

    def bytes_per_token(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.k + self.v)


# Stream order inside a layer's short-conv state: K and V projections, attention output, FFN output.
SCONV_K, SCONV_V, SCONV_ATTN, SCONV_MLP = range(4)


class SConvStatePool:
    """Per request slot and layer: the last K-1 inputs of each of the four short-conv streams (fp32).

    Every stream of every layer is a channel slice of one buffer [slots, K-1, all channels], in layer
    then stream order, so a run of consecutive layers is one channel range (`channels`): MTP rolls a
    whole trunk back in one launch (sgl_inkling_kernels.conv_rollback), not one per layer and stream.
    """

    def __init__(
        self,
        size: int,
        stream_channels: dict[int, tuple[int, int, int, int]],
        kernel_size: int,
        device: torch.device | str,
    ):
        self.size = size
        self.width = kernel_size - 1
        total = sum(sum(chans) for chans in stream_channels.values())
        self.buffer = torch.zeros(size, self.width, total, dtype=torch.float32, device=device)
        self.states: dict[int, list[torch.Tensor]] = {}
        self.channels: dict[int, tuple[int, int]] = {}  # layer -> its channel range in `buffer`
        lo = 0
        for layer, chans in stream_channels.items():
            self.channels[layer] = (lo, lo + sum(chans))
            self.states[layer] = []
            for c in chans:
                self.states[layer].append(self.buffer[..., lo : lo + c])
                lo += c

    def add_state(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """Extra per-slot state that must travel with the conv windows (saved and restored by the
        prefix cache's checkpoints), e.g. the hidden states MTP depths carry between steps."""
        device = next(iter(self.states.values()))[0].device
        t = torch.zeros((self.size, *shape), dtype=torch.float32, device=device)
        self.states[name] = [t]  # type: ignore[index]
        return t

    def copy_rows(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Copies of the rows' whole state (the conv buffer, then each extra state): a launch each."""
        return [self.buffer[rows]] + [t[rows] for name, ts in self.states.items() if not isinstance(name, int) for t in ts]

    def put_rows(self, rows: torch.Tensor, saved: list[torch.Tensor]) -> None:
        """Put back what copy_rows took."""
        extra = (t for name, ts in self.states.items() if not isinstance(name, int) for t in ts)
        for t, old in zip([self.buffer, *extra], saved, strict=True):
            t[rows] = old

    def state(self, layer_id: int, stream: int) -> torch.Tensor:
        return self.states[layer_id][stream]

    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for ts in self.states.values() for t in ts)
