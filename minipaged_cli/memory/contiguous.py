"""The contiguous strategies: one extent per request in one arena, placed first-fit, so holes appear as requests
finish (Orca's reservations, and a growable buffer)."""

from __future__ import annotations

import bisect
from abc import abstractmethod

import numpy as np

from minipaged_cli.memory.allocators import Allocator, BulkProfile, Holding
from minipaged_cli.memory.kv_groups import KVCacheGroup


class ContiguousArena:
    """One arena of ``capacity`` slots holding extents [start, start + size); free space kept as sorted holes.

    Invariants: holes and extents tile [0, capacity) exactly, never overlap, and no two holes touch (a freed
    extent merges with its neighbours).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.hole_starts: list[int] = [0]
        self.hole_sizes: list[int] = [capacity]
        self.extents: dict[int, tuple[int, int]] = {}  # owner -> (start, size)
        self.used = 0

    def first_fit(self, size: int) -> int | None:
        """Index of the first hole (lowest address) that holds ``size`` slots."""
        return next((i for i, hole in enumerate(self.hole_sizes) if hole >= size), None)

    def allocate(self, owner: int, size: int) -> bool:
        index = self.first_fit(size)
        if index is None:
            return False
        self.extents[owner] = (self._take_front(index, size), size)
        return True

    def extend_in_place(self, owner: int, new_size: int) -> bool:
        """realloc without moving: take the hole right after the extent, if it is large enough."""
        start, size = self.extents[owner]
        end = start + size
        index = bisect.bisect_left(self.hole_starts, end)
        extra = new_size - size
        if index == len(self.hole_starts) or self.hole_starts[index] != end or self.hole_sizes[index] < extra:
            return False
        self._take_front(index, extra)
        self.extents[owner] = (start, new_size)
        return True

    def _take_front(self, index: int, size: int) -> int:
        """Take ``size`` slots from the front of hole ``index``; returns where they start."""
        start = self.hole_starts[index]
        if self.hole_sizes[index] == size:
            del self.hole_starts[index], self.hole_sizes[index]
        else:
            self.hole_starts[index] += size
            self.hole_sizes[index] -= size
        self.used += size
        return start

    def free(self, owner: int) -> None:
        start, size = self.extents.pop(owner)
        self.used -= size
        index = bisect.bisect_left(self.hole_starts, start)
        merges_left = index > 0 and self.hole_starts[index - 1] + self.hole_sizes[index - 1] == start
        merges_right = index < len(self.hole_starts) and self.hole_starts[index] == start + size
        if merges_left and merges_right:
            self.hole_sizes[index - 1] += size + self.hole_sizes[index]
            del self.hole_starts[index], self.hole_sizes[index]
        elif merges_left:
            self.hole_sizes[index - 1] += size
        elif merges_right:
            self.hole_starts[index] = start
            self.hole_sizes[index] += size
        else:
            self.hole_starts.insert(index, start)
            self.hole_sizes.insert(index, size)

    def invariant_violations(self) -> list[str]:
        pieces = sorted([(s, n, "hole") for s, n in zip(self.hole_starts, self.hole_sizes, strict=True)]
                        + [(s, n, "extent") for s, n in self.extents.values()])
        problems = []
        position = 0
        for start, size, kind in pieces:
            if start != position:
                problems.append(f"{kind} at {start} but the previous piece ends at {position}: overlap or gap")
            if size <= 0:
                problems.append(f"empty {kind} at {start}")
            position = start + size
        if position != self.capacity:
            problems.append(f"pieces end at {position}, capacity is {self.capacity}")
        ends = [s + n for s, n in zip(self.hole_starts, self.hole_sizes, strict=True)]
        touching = [end for end, next_start in zip(ends, self.hole_starts[1:], strict=False) if end == next_start]
        if touching:
            problems.append(f"holes at {touching[:3]} touch the next hole: a free that did not merge")
        if self.used != sum(n for _, n in self.extents.values()):
            problems.append("the used-slot count disagrees with the extents")
        return problems


class ContiguousAllocator(Allocator):
    """One contiguous extent per request; subclasses choose how many tokens it reserves.

    With KV cache groups (``kv_groups.py``; a slot is then one token in one group) a reservation of R tokens
    takes R slots in each full-attention group and min(R, W) in each sliding-window one: a sliding layer's
    contiguous buffer is its window (a ring), never the full length.
    """

    has_external_fragmentation = True

    def __init__(self, capacity_tokens: int, max_model_len: int, groups: tuple[KVCacheGroup, ...] = ()) -> None:
        super().__init__(capacity_tokens)
        self.max_model_len = max_model_len
        self.arena = ContiguousArena(capacity_tokens)
        self.num_sliding = sum(g.is_sliding for g in groups)
        self.num_full = len(groups) - self.num_sliding if groups else 1
        self.window = next((g.sliding_window for g in groups if g.is_sliding), 0)
        self.windowed = self.num_sliding > 0

    @abstractmethod
    def extent_size(self, holding: Holding, prompt_length: int) -> int:
        """Tokens reserved at admission."""

    def slots(self, tokens: int) -> int:
        """Slots a reservation of ``tokens`` takes in every group."""
        return self.num_full * tokens + self.num_sliding * min(tokens, self.window) if self.windowed else tokens

    def tokens_held(self, slots: np.ndarray) -> np.ndarray:
        """The tokens extents of ``slots`` hold (``slots`` inverted; without a full group a full window holds any
        length: its ring)."""
        if not self.windowed:
            return slots
        ring = self.num_sliding * self.window
        if not self.num_full:
            return np.where(slots >= ring, self.max_model_len, slots // self.num_sliding)
        return np.where(slots <= (self.num_full + self.num_sliding) * self.window,
                        slots // (self.num_full + self.num_sliding), (slots - ring) // self.num_full)

    def largest_need(self, holding: Holding) -> int:
        return self.slots(self.extent_size(holding, holding.prompt_tokens))

    def admission_need(self, holding: Holding, prompt_length: int) -> int:
        return self.slots(self.extent_size(holding, prompt_length))

    def can_admit(self, holding: Holding, prompt_length: int, keep_free_blocks: int = 0) -> bool:
        return self.arena.first_fit(self.admission_need(holding, prompt_length)) is not None

    def admit(self, holding: Holding, prompt_length: int, num_computed: int | None = None, *,
              first_chunk_only: bool = False) -> int:
        if not self.arena.allocate(holding.sequence_id, self.admission_need(holding, prompt_length)):
            raise RuntimeError(f"{self.name}: admit without room; call can_admit first")
        return 0

    def token_slots(self, holding: Holding, num_tokens: int) -> int:
        return self.slots(num_tokens)

    def internal_slots(self, holding: Holding) -> int:
        return max(self.allocated(holding) - self.slots(holding.final_length), 0)

    def fork(self, parent: Holding, child: Holding, length: int) -> int | None:
        """An extent of the parent's size for the child, with the prompt's KV copied into it."""
        return length if self.arena.allocate(child.sequence_id, self.allocated(parent)) else None

    def try_grow(self, holding: Holding, length: int, new_length: int) -> int | None:
        return 0 if new_length <= int(self.tokens_held(self.allocated(holding))) else None

    def release(self, holding: Holding) -> None:
        self.arena.free(holding.sequence_id)

    def allocated(self, holding: Holding) -> int:
        return self.arena.extents[holding.sequence_id][1]

    @property
    def used_slots(self) -> int:
        return self.arena.used

    def bulk_profile(self, lengths: np.ndarray, allocated: np.ndarray, finals: np.ndarray,
                     num_steps: int) -> BulkProfile:
        # Extents stay put until some request fills its own; then that step needs try_grow.
        num_ok = max(0, min(num_steps, int((self.tokens_held(allocated) - lengths).min())))
        if not self.windowed:
            return BulkProfile(num_ok, int(allocated.sum()), int(np.maximum(allocated - finals, 0).sum()))
        steps = np.arange(1, num_ok + 1, dtype=np.int64)
        tokens = self.num_full * (lengths.sum() + len(lengths) * steps) + self.num_sliding * np.minimum(
            lengths[:, None] + steps[None, :], self.window).sum(axis=0)  # [num_ok]
        internal = np.maximum(allocated - self.num_full * finals - self.num_sliding * np.minimum(finals, self.window),
                              0).sum()
        return BulkProfile(num_ok, int(allocated.sum()), int(internal), tokens)

    def slot_owners(self, slots: np.ndarray) -> np.ndarray:
        extents = self.arena.extents
        if not extents:
            return np.full(len(slots), -1, dtype=np.int64)
        owners = np.fromiter(extents, dtype=np.int64, count=len(extents))
        starts, sizes = (np.fromiter((e[i] for e in extents.values()), dtype=np.int64, count=len(extents))
                         for i in (0, 1))
        order = np.argsort(starts)
        index = np.searchsorted(starts[order], slots, side="right") - 1
        inside = (index >= 0) & (slots < (starts + sizes)[order][np.maximum(index, 0)])
        return np.where(inside, owners[order][np.maximum(index, 0)], -1)

    def external_fragmentation(self, smallest_need: int) -> int:
        return sum(size for size in self.arena.hole_sizes if size < smallest_need)

    def invariant_violations(self) -> list[str]:
        return self.arena.invariant_violations()


class MaxReserveAllocator(ContiguousAllocator):
    name = "max-reserve"

    def extent_size(self, holding: Holding, prompt_length: int) -> int:
        return self.max_model_len


class Pow2ReserveAllocator(ContiguousAllocator):
    name = "pow2-reserve"

    def extent_size(self, holding: Holding, prompt_length: int) -> int:
        return min(next_power_of_two(holding.prompt_tokens + holding.output_tokens), self.max_model_len)


class OracleReserveAllocator(ContiguousAllocator):
    name = "oracle-reserve"

    def extent_size(self, holding: Holding, prompt_length: int) -> int:
        return holding.prompt_tokens + holding.output_tokens


class DynamicAllocator(ContiguousAllocator):
    """Starts with the next power of two above the prompt; when full, doubles: in place if the slots after it
    are free, else into a new extent (first-fit) with the KV copied over, like ``realloc``."""

    name = "dynamic"

    def extent_size(self, holding: Holding, prompt_length: int) -> int:
        return min(next_power_of_two(prompt_length + 1), self.max_model_len)

    def largest_need(self, holding: Holding) -> int:
        """The extent that holds the final length; never past max_model_len, where a request is stopped."""
        return self.slots(self._doubled(self.extent_size(holding, holding.prompt_tokens),
                                        min(holding.final_length, self.max_model_len)))

    def try_grow(self, holding: Holding, length: int, new_length: int) -> int | None:
        """None (nothing changed) also past max_model_len: no extent grows beyond it."""
        size = int(self.tokens_held(self.allocated(holding)))
        if new_length <= size:
            return 0
        if new_length > self.max_model_len:
            return None
        new_size = self.slots(self._doubled(size, new_length))
        if self.arena.extend_in_place(holding.sequence_id, new_size):
            return 0
        # Move: the new extent is taken while the old one still holds the KV being copied.
        moved_owner = -1 - holding.sequence_id
        if not self.arena.allocate(moved_owner, new_size):
            return None
        self.arena.free(holding.sequence_id)
        self.arena.extents[holding.sequence_id] = self.arena.extents.pop(moved_owner)
        return length

    def _doubled(self, size: int, length: int) -> int:
        """``size`` doubled until it holds ``length`` (<= max_model_len, the cap of every doubling)."""
        while size < length:
            size = min(2 * size, self.max_model_len)
        return size


def next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
