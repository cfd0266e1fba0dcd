"""KV offloading's data plane: whole blocks of a ``PagedKVCache`` copied down to a host pool keyed by block hash,
and back into (other) GPU blocks on a hit.

A host slot holds one block of every layer's K and V. Two host layouts, vLLM's CPU offloading before and since
0.12 (which made each block contiguous across layers for offload throughput):

- ``contiguous``: a slot is [num_layers, 2, num_kv_heads, block_size, head_dim] back to back. A store gathers the
  listed blocks of every layer into a contiguous staging buffer on the device (one gather), then makes one copy
  per block down to its host slot; a load makes one copy per block up into staging and one scatter.
- ``per-layer``: each layer's K and V keep a host tensor of their own, [num_slots, num_kv_heads, block_size,
  head_dim] like the GPU's: 2 x num_layers copies per block, each of one layer's K or V block, no staging.

The gather and scatter run through the backend: ``index_select`` / ``index_copy_`` on torch, the kernels of
``cuda/offload.cu`` on the emulated and CUDA backends. Each copy between device and host is its own call
(``copy_``), as each is its own DMA on a GPU: the per-copy cost is what the layouts trade.

On CUDA the host pool is pinned and the host copies run on a side stream, ordered with the compute stream (the
current stream) by events, so that the step's compute overlaps them:

    store:  compute: ... step writes K/V ─ gather(blocks → staging) ─ e ─ next step ...
            side:                            wait(e) ─ D2H staging → host slots ─ done
    load:   side:    H2D host slots → staging ─ done
            compute: ... wait(done) ─ scatter(staging → blocks) ─ attention reads them ...

A store reads the blocks on the compute stream, after the step that wrote them and before anything later writes
them, so a block may be reused as soon as ``store`` returns; its staging buffer lives until the side stream's
copy of it finished (``record_stream``). A load's scatter waits for its copies. The per-layer layout has no
staging: its copies read and write the GPU blocks themselves, so they wait for the compute queued before them and
the compute queued after them waits for them. Host slots are written and read
on the side stream only, in order; ``synchronize`` before the host reads them (``host_block``). On the CPU every
copy finishes before the call returns (the "host link" is then a memcpy).

Invariants: ``slots`` maps each stored hash to a distinct slot; ``free_slots`` holds every other slot; a store or
load that cannot complete (an unknown hash, not enough free slots, a block id out of range) raises ValueError
before anything is copied or any slot is taken.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from minipaged_cli.dataplane.backends import Backend
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.dataplane.offload_movers import block_mover, staging_buffer

LAYOUTS = ("contiguous", "per-layer")


@dataclass(frozen=True)
class Transfer:
    """What one store or load moved: blocks, bytes over the host link, and the number of copies it took."""

    num_blocks: int
    num_bytes: int
    num_copies: int


class HostKVPool:
    """``num_slots`` host slots of whole blocks of ``cache`` (every layer's K and V), keyed by block hash."""

    def __init__(self, cache: PagedKVCache, backend: Backend, num_slots: int, layout: str = "contiguous") -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"host layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.cache = cache
        self.backend = backend
        self.layout = layout
        self.num_slots = num_slots
        on_cuda = cache.device.type == "cuda"
        host = {"dtype": cache.dtype, "device": "cpu", "pin_memory": on_cuda}  # pinned: DMA without a bounce
        block_shape = cache.shape[1:]  # [num_kv_heads, block_size, head_dim]
        if layout == "contiguous":
            # [num_slots, num_layers, 2 (K, V), num_kv_heads, block_size, head_dim]
            self.host = torch.empty((num_slots, cache.num_layers, 2, *block_shape), **host)
        else:
            # per layer, K then V: [num_slots, num_kv_heads, block_size, head_dim]
            self.host_layers = [[torch.empty((num_slots, *block_shape), **host) for _ in range(2)]
                                for _ in range(cache.num_layers)]
        self.slots: dict[Hashable, int] = {}
        self.free_slots = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self.stream = torch.cuda.Stream(cache.device) if on_cuda else None
        self._mover = block_mover(backend, cache)
        self._timings: list[tuple[str, Any, Any]] = []  # (direction, start, end) events not yet read (CUDA)
        self.link_seconds = {"store": 0.0, "load": 0.0}  # time the host copies took, each direction
        self.bytes_moved = {"store": 0, "load": 0}

    @property
    def block_bytes(self) -> int:
        """One block of every layer's K and V: what a slot holds and one block's store moves."""
        return self.cache.block_size * self.cache.bytes_per_token

    @property
    def num_free_slots(self) -> int:
        return len(self.free_slots)

    def __contains__(self, block_hash: Hashable) -> bool:
        return block_hash in self.slots

    def store(self, pairs: Iterable[tuple[Hashable, int]]) -> Transfer:
        """Copy each (hash, GPU block id)'s block down to a free host slot; a hash already stored (or listed
        twice) is stored once. ValueError, with nothing stored, when the new hashes outnumber the free slots."""
        new: dict[Hashable, int] = {}
        for block_hash, block_id in pairs:
            if block_hash not in self.slots and block_hash not in new:
                new[block_hash] = block_id
        self._check_block_ids(new.values(), "store")
        if len(new) > len(self.free_slots):
            raise ValueError(f"the host pool has {len(self.free_slots)} free slots of {self.num_slots}; storing "
                             f"{len(new)} new blocks needs more (discard some first)")
        if not new:
            return Transfer(0, 0, 0)
        slots = [self.free_slots.pop() for _ in new]
        self.slots.update(zip(new, slots, strict=True))
        return self._store(list(new.values()), slots)

    def load(self, pairs: Iterable[tuple[Hashable, int]]) -> Transfer:
        """Copy each (hash, GPU block id)'s host block into that GPU block, before the compute queued after this
        call reads it. ValueError, with nothing copied, for an unknown hash or a block id listed twice."""
        pairs = list(pairs)
        unknown = next((h for h, _ in pairs if h not in self.slots), None)
        if unknown is not None:
            raise ValueError(f"load of block hash {unknown!r}: not in the host pool ({len(self.slots)} blocks)")
        block_ids = [block_id for _, block_id in pairs]
        self._check_block_ids(block_ids, "load")
        if len(set(block_ids)) != len(block_ids):
            raise ValueError(f"load writes one GPU block twice: {block_ids}")
        if not pairs:
            return Transfer(0, 0, 0)
        return self._load(block_ids, [self.slots[h] for h, _ in pairs])

    def discard(self, hashes: Iterable[Hashable]) -> None:
        """Free the slots of ``hashes`` (those not stored are ignored): the host tier evicted them."""
        for block_hash in hashes:
            slot = self.slots.pop(block_hash, None)
            if slot is not None:
                self.free_slots.append(slot)

    def host_block(self, block_hash: Hashable) -> torch.Tensor:
        """A copy of the stored block, [num_layers, 2, num_kv_heads, block_size, head_dim] whatever the layout."""
        self.synchronize()
        slot = self.slots[block_hash]
        if self.layout == "contiguous":
            return self.host[slot].clone()
        return torch.stack([torch.stack([kv[slot] for kv in layer]) for layer in self.host_layers])

    def synchronize(self) -> None:
        """Wait for every copy queued; add the finished copies' time to ``link_seconds``."""
        if self.stream is not None:
            self.stream.synchronize()
        for direction, start, end in self._timings:
            self.link_seconds[direction] += start.elapsed_time(end) / 1e3
        self._timings.clear()

    # -- the copies -------------------------------------------------------------------------------------------

    def _store(self, block_ids: list[int], slots: list[int]) -> Transfer:
        cache = self.cache
        if self.layout == "per-layer":
            # Straight from the GPU blocks: the compute stream waits for the copies before it writes them again.
            with _SideStream(self, "store", waits_for_compute=True, compute_waits=True):
                for gpu_block, host_slot in self._per_layer_blocks(block_ids, slots):
                    host_slot.copy_(gpu_block, non_blocking=True)
            copies = 2 * cache.num_layers * len(slots)
        else:
            # [num_blocks, num_layers, 2, num_kv_heads, block_size, head_dim], gathered on the compute stream
            staging = self._mover.gather(self._device_ids(block_ids))
            with _SideStream(self, "store", waits_for_compute=True, compute_waits=False):
                for row, slot in enumerate(slots):
                    self.host[slot].copy_(staging[row], non_blocking=True)
                if self.stream is not None:
                    staging.record_stream(self.stream)  # kept until the side stream's copies of it are done
            copies = len(slots)
        return self._moved("store", len(slots), copies)

    def _load(self, block_ids: list[int], slots: list[int]) -> Transfer:
        cache = self.cache
        if self.layout == "per-layer":
            # Straight into the GPU blocks: after the compute queued so far has read what they held.
            with _SideStream(self, "load", waits_for_compute=True, compute_waits=True):
                for gpu_block, host_slot in self._per_layer_blocks(block_ids, slots):
                    gpu_block.copy_(host_slot, non_blocking=True)
            copies = 2 * cache.num_layers * len(slots)
        else:
            # Into fresh staging memory of the side stream's own: the copies need not wait for the compute stream.
            with _SideStream(self, "load", waits_for_compute=False, compute_waits=True):
                staging = staging_buffer(cache, len(slots))
                for row, slot in enumerate(slots):
                    staging[row].copy_(self.host[slot], non_blocking=True)
            if self.stream is not None:
                staging.record_stream(torch.cuda.current_stream(cache.device))  # allocated on the side stream
            self._mover.scatter(self._device_ids(block_ids), staging)
            copies = len(slots)
        return self._moved("load", len(slots), copies)

    def _device_ids(self, block_ids: list[int]) -> torch.Tensor:
        """int64 [n] on the cache's device. On CUDA through pinned memory, without waiting: a copy from pageable
        memory would hold the host until the compute stream drained, and the copies would overlap nothing."""
        if self.stream is None:
            return torch.tensor(block_ids, dtype=torch.int64)
        return torch.tensor(block_ids, dtype=torch.int64, pin_memory=True).to(self.cache.device, non_blocking=True)

    def _per_layer_blocks(self, block_ids: list[int],
                          slots: list[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(GPU block, host slot) of each layer's K and V for every pair: the per-layer layout's copies, each
        [num_kv_heads, block_size, head_dim]."""
        cache = self.cache
        for layer, host_kv in enumerate(self.host_layers):
            for gpu, host in zip((cache.key_cache[layer], cache.value_cache[layer]), host_kv, strict=True):
                for block_id, slot in zip(block_ids, slots, strict=True):
                    yield gpu[block_id], host[slot]

    def _moved(self, direction: str, num_blocks: int, num_copies: int) -> Transfer:
        num_bytes = num_blocks * self.block_bytes
        self.bytes_moved[direction] += num_bytes
        return Transfer(num_blocks, num_bytes, num_copies)

    def _check_block_ids(self, block_ids: Iterable[int], what: str) -> None:
        bad = next((b for b in block_ids if not 0 <= b < self.cache.num_blocks), None)
        if bad is not None:
            raise ValueError(f"{what} of GPU block {bad}: outside [0, {self.cache.num_blocks})")


class _SideStream:
    """The host copies of one store or load: on CUDA, on the pool's side stream, timed by events. With
    ``waits_for_compute`` the side stream first waits for the work queued on the compute stream (what the copies
    read or overwrite); with ``compute_waits`` the compute stream then waits for the copies (a load's blocks are
    read next; a per-layer store's blocks may be written next). On the CPU, timed on the host clock."""

    def __init__(self, pool: HostKVPool, direction: str, waits_for_compute: bool, compute_waits: bool) -> None:
        self.pool = pool
        self.direction = direction
        self.waits_for_compute = waits_for_compute
        self.compute_waits = compute_waits

    def __enter__(self) -> None:
        stream = self.pool.stream
        if stream is None:
            self.started = time.perf_counter()
            return
        self.compute = torch.cuda.current_stream(stream.device)
        if self.waits_for_compute:
            stream.wait_stream(self.compute)
        self.context = torch.cuda.stream(stream)
        self.context.__enter__()
        self.start = torch.cuda.Event(enable_timing=True)
        self.start.record(stream)

    def __exit__(self, *exc: object) -> None:
        pool, stream = self.pool, self.pool.stream
        if stream is None:
            pool.link_seconds[self.direction] += time.perf_counter() - self.started
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        self.context.__exit__(*exc)
        pool._timings.append((self.direction, self.start, end))
        if self.compute_waits:
            self.compute.wait_event(end)
