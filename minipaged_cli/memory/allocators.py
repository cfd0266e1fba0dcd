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

This module holds what every strategy shares (``Holding``, ``BulkProfile``, the ``Allocator`` interface);
``paged.py`` and ``contiguous.py`` the strategies; ``strategies.py`` their names and the factory.

A strategy answers "can this request be admitted", "make room for this many tokens", "release", "fork a
sample", and, for the simulator's fast path, how its allocation evolves over ``k`` decode steps without any
admission or release. Only ``paged`` shares memory: prefix-cache hits and forked samples hold the same blocks
(``shared_slots`` is what the per-request sums count more than once); a contiguous fork copies the prompt.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False, slots=True)  # compared by identity: the simulator keeps them in lists
class Holding:
    """A request as the allocators see it: the id it is allocated under, the lengths that size it, and the
    content keys of its full blocks (for prefix caching; empty without it)."""

    sequence_id: int
    prompt_tokens: int
    output_tokens: int
    block_hashes: list[Hashable] = field(default_factory=list, repr=False)
    # Tokens whose KV is ever written: the last sampled token is never fed back. (Stored, not a property: a bulk
    # advance reads it of every running request; the lengths that size it never change.)
    final_length: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.final_length = self.prompt_tokens + self.output_tokens - 1


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
    tokens: np.ndarray | None = None  # [num_steps] token-state slots (``Allocator.token_slots``); None: the lengths


def total_slots(allocated: np.ndarray | int) -> int:
    """Σ of what ``Allocator.bulk_allocations`` gives: each request's slots, or their sum already (then as is)."""
    return allocated if isinstance(allocated, int) else int(np.add.reduce(allocated))


@dataclass(frozen=True)
class BlockCounters:
    """Block-pool events over a replay (all 0 for strategies without blocks)."""

    num_evictions: int = 0  # cached blocks the pool handed out again
    num_copy_on_writes: int = 0
    num_allocations: int = 0  # blocks taken from the free queue, ever
    num_frees: int = 0


class Allocator(ABC):
    name: str
    has_external_fragmentation = False
    windowed = False  # some layers let go of tokens outside their window: token states are not the lengths
    # ``grow_decodes`` and ``advance`` skip the per-request calls where nothing but lengths changes (``paged``);
    # False on an instance: the readable one-request-at-a-time path, the reference the property tests compare.
    grows_in_batches = False

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens

    @abstractmethod
    def largest_need(self, holding: Holding) -> int:
        """The most slots the request will ever hold at once; above the capacity it can never run."""

    @abstractmethod
    def admission_need(self, holding: Holding, prompt_length: int) -> int:
        """Slots that must be free (in one piece, for contiguous strategies) to admit with that prompt."""

    @abstractmethod
    def can_admit(self, holding: Holding, prompt_length: int, keep_free_blocks: int = 0) -> bool:
        """Whether the request fits now, leaving ``keep_free_blocks`` blocks free (a watermark: ``paged`` only)."""

    def admission_headroom(self, holding: Holding, prompt_length: int, keep_free_blocks: int = 0) -> int:
        """Slots the running requests may still take before the request no longer fits (negative: it does not
        fit now). Only ``paged`` allocates as requests decode; a contiguous extent is taken at admission."""
        return 0 if self.can_admit(holding, prompt_length, keep_free_blocks) else -1

    @property
    def supports_prefix_caching(self) -> bool:
        """Whether requests can share cached full blocks of their prompt (content keys matter)."""
        return False

    def cached_prefix(self, holding: Holding, prompt_length: int) -> int:
        """Prompt tokens that admitting the request now would find already computed (prefix-cache hits)."""
        return 0

    @abstractmethod
    def admit(self, holding: Holding, prompt_length: int, num_computed: int | None = None, *,
              first_chunk_only: bool = False) -> int:
        """Allocate for a prompt of ``prompt_length`` tokens, of which the step admitting it computes (or swaps
        back) the first ``num_computed`` (None: all); returns the tokens found already computed (prefix cache
        hits). Precondition: ``can_admit``. ``first_chunk_only``: allocate only up to ``num_computed``, the rest
        chunk by chunk through ``try_grow`` (``paged``; a contiguous extent is sized by the prompt)."""

    @abstractmethod
    def fork(self, parent: Holding, child: Holding, length: int) -> int | None:
        """Give ``child`` the parent's ``length`` tokens. Returns the tokens copied, or None (nothing changed)."""

    def rejection_reason(self, holding: Holding, watermark_blocks: int | None = None) -> str | None:
        """Why the request can never run under this strategy, or None. ``watermark_blocks``: the prompt must also
        fit in the blocks above that watermark (``paged``; None: no such rule)."""
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

    def grow_decodes(self, holdings: Sequence[Holding]) -> int:
        """Give each of the running requests, in order, the slot of its next decode token, as ``try_grow`` by one
        token each (read only when ``grows_in_batches``); stops at the first that cannot grow, it and the rest
        unchanged. Returns how many grew."""
        raise NotImplementedError(f"{self.name} grows each request through try_grow, which needs its length")

    def mark_computed(self, holding: Holding, num_computed: int) -> None:  # noqa: B027 - a no-op by default
        """The step that writes the request's first ``num_computed`` tokens has run (prefix caching publishes
        full blocks only then)."""

    def name_private(self, holding: Holding, block_hashes: list[Hashable]) -> None:  # noqa: B027 - no keys, no-op
        """The request's blocks that carry ``pool_loops.PRIVATE`` take their keys, ``block_hashes`` (its own, in
        full): it may ask for its own content again (``Scheduler._drop``)."""

    @abstractmethod
    def release(self, holding: Holding) -> None: ...

    @abstractmethod
    def allocated(self, holding: Holding) -> int:
        """Slots the request holds now."""

    def allocations(self, holdings: Sequence[Holding]) -> list[int]:
        """``allocated`` of each request, in order (the accounting asks for every running request each step)."""
        return [self.allocated(holding) for holding in holdings]

    def allocation_sums(self, holdings: Sequence[Holding]) -> tuple[int, int]:
        """Σ ``allocated`` over the requests, and Σ max(allocated - final length, 0): the slots no token will
        ever fill (what the accounting's categories read every step)."""
        allocated = self.allocations(holdings)
        past = [slots - holding.final_length for slots, holding in zip(allocated, holdings, strict=True)]
        return sum(allocated), sum(slots for slots in past if slots > 0)

    def bulk_allocations(self, holdings: Sequence[Holding]) -> np.ndarray | int:
        """What ``bulk_profile`` reads of the requests' allocations: ``allocations`` ([n] int64), or their sum where
        the strategy's profile reads only that (``paged``: the pool counts it, without a pass over the requests)."""
        return np.array(self.allocations(holdings), dtype=np.int64)

    def full_attention_pool(self, holdings: Sequence[Holding]) -> tuple[int, int, int] | None:
        """Where ``bulk_profile`` is one full-attention pool's (a request holds ceil(L / B) blocks of B slots, taken
        while free ones last): B, the free blocks and ``bulk_allocations``' sum, which a compiled bulk profiles from
        (``sim/bulk_advance.py``); None elsewhere."""
        return None

    def token_slots(self, holding: Holding, num_tokens: int) -> int:
        """Slots holding the K/V of the request's first ``num_tokens`` tokens (read only when ``windowed``)."""
        raise NotImplementedError(f"{self.name} keeps every token: its token states are the lengths")

    def internal_slots(self, holding: Holding) -> int:
        """Slots the request holds past its final length (read only when ``windowed``)."""
        raise NotImplementedError(f"{self.name} holds one extent: its internal fragmentation is A - F")

    def counters(self) -> BlockCounters:
        return BlockCounters()

    def block_table(self, sequence_id: int) -> list[int]:
        """The physical blocks holding the sequence's tokens, in order (what a data plane addresses)."""
        raise NotImplementedError(f"{self.name} keeps no block tables: the data plane runs the paged strategy only")

    @property
    @abstractmethod
    def used_slots(self) -> int: ...

    @abstractmethod
    def bulk_profile(self, lengths: np.ndarray, allocated: np.ndarray | int, finals: np.ndarray,
                     num_steps: int) -> BulkProfile:
        """For running requests of ``lengths`` holding ``allocated`` slots (each request's, or their sum where
        ``bulk_allocations`` gives it), each writing one token a step."""

    def advance(self, holdings: list[Holding], num_steps: int) -> None:  # noqa: B027 - a no-op by default
        """Apply ``num_steps`` decode steps of a ``bulk_profile`` (the contiguous extents already hold them)."""

    def external_fragmentation(self, smallest_need: int) -> int:
        """Free slots in holes smaller than ``smallest_need`` (the smallest waiting request's need)."""
        return 0  # blocks: any free block serves any request

    @abstractmethod
    def slot_owners(self, slots: np.ndarray) -> np.ndarray:
        """The sequence id holding each of ``slots`` (physical slot addresses), -1 where none does."""

    @abstractmethod
    def invariant_violations(self) -> list[str]: ...
