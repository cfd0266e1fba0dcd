"""Allocation strategies: where the simulator puts each running request's KV slots.

All strategies share one capacity of ``capacity_tokens`` slots. ``paged`` hands out fixed-size blocks on demand
through the ``KVBlockManager``; the contiguous strategies give each request one extent of one arena, placed
first-fit, so holes appear as requests finish:

| strategy        | extent reserved at admission                          | grows            |
|-----------------|-------------------------------------------------------|------------------|
| max-reserve     | max_model_len                                         | never            |
| pow2-reserve    | next power of two >= prompt + output (<= max len)     | never            |
| oracle-reserve  | prompt + output                                       | never            |
| dynamic         | next power of two > current length                    | doubles: moves   |

A strategy answers "can this request be admitted", "make room for this many tokens", "release", "fork a
sample", and, for the simulator's fast path, how its allocation evolves over ``k`` decode steps without any
admission or release. Only ``paged`` shares memory: prefix-cache hits and forked samples hold the same blocks
(``shared_slots`` is what the per-request sums count more than once); a contiguous fork copies the prompt.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from minipaged_cli.memory.block_manager import KVBlockManager, OutOfBlocksError, num_blocks_for

STRATEGIES = ("paged", "max-reserve", "pow2-reserve", "oracle-reserve", "dynamic")


@dataclass(eq=False)  # compared by identity: the simulator keeps them in lists
class Holding:
    """A request as the allocators see it: the id it is allocated under, the lengths that size it, and the
    content keys of its full blocks (for prefix caching; empty without it)."""

    sequence_id: int
    prompt_tokens: int
    output_tokens: int
    block_hashes: list[Hashable] = field(default_factory=list, repr=False)

    @property
    def final_length(self) -> int:
        """Tokens whose KV is ever written: the last sampled token is never fed back."""
        return self.prompt_tokens + self.output_tokens - 1


@dataclass(frozen=True)
class BulkProfile:
    """How allocation evolves over the next ``num_steps`` decode steps (one token per running request each).

    ``allocated[j]`` and ``internal[j]`` are the slots allocated and the slots past every request's final length
    during step ``j + 1``, or one int when they stay constant. ``num_steps`` may be shorter than asked when the
    strategy must act (allocate a block it does not have, move an extent) before then; 0 means the very next
    step needs the slow path.
    """

    num_steps: int
    allocated: np.ndarray | int  # [num_steps] int64
    internal: np.ndarray | int  # [num_steps] int64


class Allocator(ABC):
    name: str
    has_external_fragmentation = False

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens

    @abstractmethod
    def largest_need(self, holding: Holding) -> int:
        """The most slots the request will ever hold at once; above the capacity it can never run."""

    @abstractmethod
    def admission_need(self, holding: Holding, prompt_length: int) -> int:
        """Slots that must be free (in one piece, for contiguous strategies) to admit with that prompt."""

    @abstractmethod
    def can_admit(self, holding: Holding, prompt_length: int) -> bool: ...

    @abstractmethod
    def admit(self, holding: Holding, prompt_length: int, num_computed: int | None = None) -> int:
        """Allocate for a prompt of ``prompt_length`` tokens, of which the step admitting it computes (or swaps
        back) the first ``num_computed`` (None: all); returns the tokens found already computed (prefix cache
        hits). Precondition: ``can_admit``."""

    @abstractmethod
    def fork(self, parent: Holding, child: Holding, length: int) -> int | None:
        """Give ``child`` the parent's ``length`` tokens. Returns the tokens copied, or None (nothing changed)."""

    def rejection_reason(self, holding: Holding) -> str | None:
        """Why the request can never run under this strategy, or None."""
        if self.largest_need(holding) > self.capacity_tokens:
            return "needs more KV than the whole pool"
        return None

    def swap_slots(self, holding: Holding, length: int) -> int:
        """Slots that swapping the request out (or back in) moves: what it has written."""
        return length

    @property
    def shared_slots(self) -> int:
        """Slots that the per-request allocations count more than once (held by several requests)."""
        return 0

    def take_copies(self) -> list[tuple[int, int]]:
        """Block copies (src, dst) that copy-on-write decided since the last call."""
        return []

    @abstractmethod
    def try_grow(self, holding: Holding, length: int, new_length: int) -> int | None:
        """Make room for ``new_length`` tokens. Returns the tokens copied to do so, or None (nothing changed)."""

    def mark_computed(self, holding: Holding, num_computed: int) -> None:  # noqa: B027 - a no-op by default
        """The step that writes the request's first ``num_computed`` tokens has run (prefix caching publishes
        full blocks only then)."""

    @abstractmethod
    def release(self, holding: Holding) -> None: ...

    @abstractmethod
    def allocated(self, holding: Holding) -> int:
        """Slots the request holds now."""

    @property
    @abstractmethod
    def used_slots(self) -> int: ...

    @abstractmethod
    def bulk_profile(self, lengths: np.ndarray, allocated: np.ndarray, finals: np.ndarray,
                     num_steps: int) -> BulkProfile:
        """For running requests of ``lengths`` holding ``allocated`` slots, each writing one token a step."""

    def advance(self, holdings: list[Holding], num_steps: int) -> None:  # noqa: B027 - a no-op by default
        """Apply ``num_steps`` decode steps of a ``bulk_profile`` (the contiguous extents already hold them)."""

    def external_fragmentation(self, smallest_need: int) -> int:
        """Free slots in holes smaller than ``smallest_need`` (the smallest waiting request's need)."""
        return 0  # blocks: any free block serves any request

    @abstractmethod
    def invariant_violations(self) -> list[str]: ...


class PagedAllocator(Allocator):
    """Blocks of ``block_size`` on demand; the ``KVBlockManager`` is the source of truth.

    With prefix caching a full block joins the cache when the step that computes it is scheduled, never earlier
    (vLLM's ``cache_blocks``): a prompt admitted whole but prefilled in chunks publishes each chunk's blocks as
    the replay schedules the chunk (``mark_computed``), so a request preempted mid-prefill leaves no block that
    no step wrote in the cache.
    """

    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False,
                 watermark_blocks: int = 0) -> None:
        super().__init__(num_blocks * block_size)
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks  # admission leaves this many blocks free (vLLM's watermark)
        self.manager = KVBlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)

    def largest_need(self, holding: Holding) -> int:
        return num_blocks_for(holding.final_length, self.block_size) * self.block_size

    def admission_need(self, holding: Holding, prompt_length: int) -> int:
        return num_blocks_for(prompt_length, self.block_size) * self.block_size

    def rejection_reason(self, holding: Holding) -> str | None:
        prompt_blocks = num_blocks_for(holding.prompt_tokens, self.block_size)
        if prompt_blocks > self.manager.num_physical_blocks - self.watermark_blocks:
            return "its prompt needs more blocks than the pool has above the watermark"
        return super().rejection_reason(holding)

    def can_admit(self, holding: Holding, prompt_length: int) -> bool:
        needed = self.manager.blocks_needed(None, prompt_length, holding.block_hashes)
        return needed + self.watermark_blocks <= self.manager.num_free_blocks

    def admit(self, holding: Holding, prompt_length: int, num_computed: int | None = None) -> int:
        if not self.can_admit(holding, prompt_length):
            raise OutOfBlocksError(f"cannot admit {prompt_length} tokens: {self.manager.num_free_blocks} blocks free")
        state = self.manager.create_sequence(holding.sequence_id, prompt_length, block_hashes=holding.block_hashes,
                                             num_computed_tokens=num_computed)
        return state.num_cached_tokens

    def fork(self, parent: Holding, child: Holding, length: int) -> int | None:
        self.manager.fork(parent.sequence_id, child.sequence_id, block_hashes=child.block_hashes)
        return 0  # shared until one of them writes into the partly filled last block

    def swap_slots(self, holding: Holding, length: int) -> int:
        return num_blocks_for(length, self.block_size) * self.block_size  # whole blocks move

    @property
    def shared_slots(self) -> int:
        return self.manager.num_shared_references * self.block_size

    def take_copies(self) -> list[tuple[int, int]]:
        return self.manager.take_pending_copies()

    def try_grow(self, holding: Holding, length: int, new_length: int) -> int | None:
        try:
            self.manager.grow(holding.sequence_id, new_length - length)
        except OutOfBlocksError:
            return None
        return 0

    def mark_computed(self, holding: Holding, num_computed: int) -> None:
        self.manager.mark_computed(holding.sequence_id, num_computed)

    def release(self, holding: Holding) -> None:
        self.manager.release_sequence(holding.sequence_id)

    def allocated(self, holding: Holding) -> int:
        return len(self.manager.sequences[holding.sequence_id].block_table) * self.block_size

    @property
    def used_slots(self) -> int:
        return self.manager.num_used_blocks * self.block_size

    def bulk_profile(self, lengths: np.ndarray, allocated: np.ndarray, finals: np.ndarray,
                     num_steps: int) -> BulkProfile:
        # [n, k] matrix of lengths during each step; the caller keeps n * k small.
        steps = np.arange(1, num_steps + 1, dtype=np.int64)
        length_matrix = lengths[:, None] + steps[None, :]
        allocated_matrix = -(-length_matrix // self.block_size) * self.block_size
        allocated_per_step = allocated_matrix.sum(axis=0)
        new_blocks = (allocated_per_step - allocated.sum()) // self.block_size
        num_ok = int(np.searchsorted(new_blocks, self.manager.num_free_blocks, side="right"))
        internal = np.maximum(allocated_matrix[:, :num_ok] - finals[:, None], 0).sum(axis=0)
        return BulkProfile(num_ok, allocated_per_step[:num_ok], internal)

    def advance(self, holdings: list[Holding], num_steps: int) -> None:
        for holding in holdings:
            self.manager.grow(holding.sequence_id, num_steps)

    def invariant_violations(self) -> list[str]:
        return self.manager.invariant_violations()


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
    """One contiguous extent per request; subclasses choose its size."""

    has_external_fragmentation = True

    def __init__(self, capacity_tokens: int, max_model_len: int) -> None:
        super().__init__(capacity_tokens)
        self.max_model_len = max_model_len
        self.arena = ContiguousArena(capacity_tokens)

    @abstractmethod
    def extent_size(self, holding: Holding, prompt_length: int) -> int:
        """Slots reserved at admission."""

    def largest_need(self, holding: Holding) -> int:
        return self.extent_size(holding, holding.prompt_tokens)

    def admission_need(self, holding: Holding, prompt_length: int) -> int:
        return self.extent_size(holding, prompt_length)

    def can_admit(self, holding: Holding, prompt_length: int) -> bool:
        return self.arena.first_fit(self.extent_size(holding, prompt_length)) is not None

    def admit(self, holding: Holding, prompt_length: int, num_computed: int | None = None) -> int:
        if not self.arena.allocate(holding.sequence_id, self.extent_size(holding, prompt_length)):
            raise RuntimeError(f"{self.name}: admit without room; call can_admit first")
        return 0

    def fork(self, parent: Holding, child: Holding, length: int) -> int | None:
        """An extent of the parent's size for the child, with the prompt's KV copied into it."""
        return length if self.arena.allocate(child.sequence_id, self.allocated(parent)) else None

    def try_grow(self, holding: Holding, length: int, new_length: int) -> int | None:
        return 0 if new_length <= self.allocated(holding) else None

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
        num_ok = max(0, min(num_steps, int((allocated - lengths).min())))
        return BulkProfile(num_ok, int(allocated.sum()), int(np.maximum(allocated - finals, 0).sum()))

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
        size = self.extent_size(holding, holding.prompt_tokens)
        while size < holding.final_length:
            size = min(2 * size, self.max_model_len)
        return size

    def try_grow(self, holding: Holding, length: int, new_length: int) -> int | None:
        size = self.allocated(holding)
        if new_length <= size:
            return 0
        new_size = size
        while new_size < new_length:
            new_size = min(2 * new_size, self.max_model_len)
        if self.arena.extend_in_place(holding.sequence_id, new_size):
            return 0
        # Move: the new extent is taken while the old one still holds the KV being copied.
        moved_owner = -1 - holding.sequence_id
        if not self.arena.allocate(moved_owner, new_size):
            return None
        self.arena.free(holding.sequence_id)
        self.arena.extents[holding.sequence_id] = self.arena.extents.pop(moved_owner)
        return length


def next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def make_allocator(name: str, *, num_blocks: int, block_size: int, max_model_len: int,
                   prefix_caching: bool = False, watermark_blocks: int = 0) -> Allocator:
    capacity = num_blocks * block_size
    if name == "paged":
        return PagedAllocator(num_blocks, block_size, prefix_caching=prefix_caching,
                              watermark_blocks=watermark_blocks)
    contiguous = {
        "max-reserve": MaxReserveAllocator,
        "pow2-reserve": Pow2ReserveAllocator,
        "oracle-reserve": OracleReserveAllocator,
        "dynamic": DynamicAllocator,
    }
    return contiguous[name](capacity, max_model_len)
