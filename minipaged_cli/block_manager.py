"""The CPU metadata plane: which physical KV block holds which token of which sequence.

A sequence owns logically contiguous token positions; physically its K/V live in fixed-size blocks anywhere in
a pool of ``num_physical_blocks``. For token position ``pos`` of a sequence::

    logical_block  = pos // block_size
    block_offset   = pos %  block_size
    physical_block = block_table[logical_block]
    slot           = physical_block * block_size + block_offset      # what the cache-write kernel receives

Worked example (block_size 4, block_table [5, 2, 9, 1]): token 6 -> logical 1, offset 2, physical 2, slot 10.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SequenceId = Hashable


class BlockManagerError(Exception):
    """Base class of every error the block manager raises; a failed call changes nothing."""


class OutOfBlocksError(BlockManagerError):
    """The pool has fewer free blocks than the call needs."""


class UnknownSequenceError(BlockManagerError, KeyError):
    """The sequence id was never created (or was released and not created again)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateSequenceError(BlockManagerError):
    """``create_sequence`` with an id that is already live."""


class DoubleReleaseError(UnknownSequenceError):
    """``release_sequence`` on a sequence that was already released."""


@dataclass
class SequenceState:
    """One live sequence: how many tokens it holds and where they are.

    ``sequence_length`` is the number of tokens written so far, and so the position of the next append.
    ``block_table[i]`` is the physical block holding logical block ``i``.
    """

    sequence_id: SequenceId
    sequence_length: int = 0
    block_table: list[int] = field(default_factory=list)


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """ceil(num_tokens / block_size): blocks a sequence of that length holds."""
    return -(-num_tokens // block_size)


def tail_waste(num_tokens: int, block_size: int) -> int:
    """Slots allocated but unused in a sequence's last block: 0 if L % B == 0, else B - L % B."""
    return num_blocks_for(num_tokens, block_size) * block_size - num_tokens


class KVBlockManager:
    """Allocates fixed-size KV blocks to sequences from one pool.

    Invariants (``invariant_violations`` checks them all; property tests check them after every operation):

    - allocated blocks = union of all block tables, and no block is in two tables;
    - allocated ∩ free = ∅ and |allocated| + |free| = num_physical_blocks;
    - no block appears twice in the free list, and every block id is in [0, num_physical_blocks);
    - every sequence holds ceil(sequence_length / block_size) blocks: a block is taken only when a token needs it.

    Every public method either succeeds or raises a ``BlockManagerError`` with the state exactly as before:
    multi-token calls (``append_tokens``, ``slot_mapping_for_append``) count the blocks they need first.
    Freed blocks go to the back of the free queue and allocation takes from the front, so a block just freed
    is reused last.
    """

    def __init__(self, num_physical_blocks: int, block_size: int) -> None:
        if num_physical_blocks < 1:
            raise ValueError(f"num_physical_blocks must be >= 1, got {num_physical_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_physical_blocks = num_physical_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_physical_blocks))
        self.sequences: dict[SequenceId, SequenceState] = {}
        self._released: set[SequenceId] = set()
        self.num_allocations = 0  # blocks taken from the free queue, ever
        self.num_frees = 0  # blocks returned to it, ever

    # -- queries -------------------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_physical_blocks - len(self.free_blocks)

    def blocks_needed(self, sequence_id: SequenceId | None, num_tokens: int) -> int:
        """New blocks that appending ``num_tokens`` to the sequence (None: a new, empty one) would take."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if sequence_id is None:
            return num_blocks_for(num_tokens, self.block_size)
        state = self._state(sequence_id)
        return num_blocks_for(state.sequence_length + num_tokens, self.block_size) - len(state.block_table)

    def can_allocate(self, num_tokens: int, sequence_id: SequenceId | None = None) -> bool:
        """Whether ``num_tokens`` more tokens fit: for a new sequence, or appended to ``sequence_id``."""
        return self.blocks_needed(sequence_id, num_tokens) <= len(self.free_blocks)

    def internal_fragmentation_tokens(self) -> int:
        """Slots allocated to live sequences but not (yet) holding a token: the tails of their last blocks."""
        return sum(
            len(s.block_table) * self.block_size - s.sequence_length for s in self.sequences.values()
        )

    # -- lifecycle -----------------------------------------------------------------------------------------

    def create_sequence(self, sequence_id: SequenceId) -> SequenceState:
        """Start an empty sequence; it takes no block until its first token."""
        if sequence_id in self.sequences:
            raise DuplicateSequenceError(f"sequence {sequence_id!r} already exists")
        state = SequenceState(sequence_id)
        self.sequences[sequence_id] = state
        self._released.discard(sequence_id)
        return state

    def allocate_block(self) -> int:
        """Take one block from the free queue (the caller puts it in a block table)."""
        if not self.free_blocks:
            raise OutOfBlocksError(f"no free block: all {self.num_physical_blocks} blocks are in use")
        self.num_allocations += 1
        return self.free_blocks.popleft()

    def append_token(self, sequence_id: SequenceId) -> int:
        """Reserve the slot of the sequence's next token, taking a new block at a block boundary."""
        state = self._state(sequence_id)
        logical_block, block_offset = divmod(state.sequence_length, self.block_size)
        if logical_block == len(state.block_table):
            state.block_table.append(self.allocate_block())
        state.sequence_length += 1
        return state.block_table[logical_block] * self.block_size + block_offset

    def append_tokens(self, sequence_id: SequenceId, num_tokens: int) -> list[int]:
        """Reserve the next ``num_tokens`` slots of a sequence (a prefill); all of them or none."""
        start = self._state(sequence_id).sequence_length
        state = self.grow(sequence_id, num_tokens)
        return [self._slot(state, pos) for pos in range(start, start + num_tokens)]

    def grow(self, sequence_id: SequenceId, num_tokens: int) -> SequenceState:
        """``append_tokens`` without building the slot list, for callers that only track memory (the simulator)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        state = self._state(sequence_id)
        new_length = state.sequence_length + num_tokens
        needed = -(-new_length // self.block_size) - len(state.block_table)
        if needed > len(self.free_blocks):
            raise OutOfBlocksError(
                f"{num_tokens} tokens for sequence {sequence_id!r} need {needed} new blocks, "
                f"{len(self.free_blocks)} free"
            )
        append, take = state.block_table.append, self.free_blocks.popleft
        for _ in range(needed):
            append(take())
        self.num_allocations += needed
        state.sequence_length = new_length
        return state

    def slot_mapping_for_append(self, sequence_ids: Sequence[SequenceId]) -> list[int]:
        """One new token for each listed sequence (a decode step); returns their slots in order.

        Atomic: if the pool cannot serve every sequence, nothing is appended.
        """
        appends: dict[SequenceId, int] = {}
        for sequence_id in sequence_ids:
            appends[sequence_id] = appends.get(sequence_id, 0) + 1
        needed = sum(self.blocks_needed(sid, n) for sid, n in appends.items())
        if needed > len(self.free_blocks):
            raise OutOfBlocksError(
                f"decode step for {len(sequence_ids)} sequences needs {needed} new blocks, "
                f"{len(self.free_blocks)} free"
            )
        return [self.append_token(sid) for sid in sequence_ids]

    def release_sequence(self, sequence_id: SequenceId) -> None:
        """Return every block of the sequence to the free queue and forget the sequence."""
        if sequence_id in self._released and sequence_id not in self.sequences:
            raise DoubleReleaseError(f"sequence {sequence_id!r} was already released")
        state = self._state(sequence_id)
        self.free_blocks.extend(state.block_table)
        self.num_frees += len(state.block_table)
        del self.sequences[sequence_id]
        self._released.add(sequence_id)

    # -- batch metadata for the data plane -----------------------------------------------------------------

    def get_block_table_tensor(self, sequence_ids: Sequence[SequenceId], *, as_torch: bool = False) -> Any:
        """``[batch, max_blocks]`` int32 block tables, padded with -1.

        Returns a NumPy array; ``as_torch=True`` returns a CPU ``torch.Tensor`` sharing its memory
        (torch is imported only then).
        """
        tables = [self._state(sid).block_table for sid in sequence_ids]
        width = max((len(t) for t in tables), default=0)
        out = np.full((len(tables), width), -1, dtype=np.int32)  # [batch, max_blocks]
        for row, table in enumerate(tables):
            out[row, : len(table)] = table
        return _maybe_torch(out, as_torch)

    def get_seq_lens_tensor(self, sequence_ids: Sequence[SequenceId], *, as_torch: bool = False) -> Any:
        """``[batch]`` int32 sequence lengths; NumPy, or a CPU ``torch.Tensor`` with ``as_torch=True``."""
        lens = np.array([self._state(sid).sequence_length for sid in sequence_ids], dtype=np.int32)
        return _maybe_torch(lens, as_torch)

    # -- invariants ----------------------------------------------------------------------------------------

    def invariant_violations(self) -> list[str]:
        """Every broken invariant, each as a sentence naming the bug it points to; empty when all hold."""
        problems: list[str] = []
        allocated: list[int] = []
        for state in self.sequences.values():
            allocated.extend(state.block_table)
            expected = num_blocks_for(state.sequence_length, self.block_size)
            if len(state.block_table) != expected:
                problems.append(
                    f"sequence {state.sequence_id!r} holds {len(state.block_table)} blocks for "
                    f"{state.sequence_length} tokens, expected {expected}: a block taken too early or leaked"
                )
        allocated_set = set(allocated)
        free_set = set(self.free_blocks)
        if len(allocated_set) != len(allocated):
            problems.append("a block is in two block tables (or twice in one): two sequences share a slot")
        if len(free_set) != len(self.free_blocks):
            problems.append("a block is twice in the free list: a double free")
        if allocated_set & free_set:
            problems.append(f"blocks {sorted(allocated_set & free_set)[:5]} are both allocated and free")
        if len(allocated_set) + len(free_set) != self.num_physical_blocks:
            problems.append(
                f"{len(allocated_set)} allocated + {len(free_set)} free != {self.num_physical_blocks} blocks: "
                "a block leaked"
            )
        out_of_range = [b for b in allocated_set | free_set if not 0 <= b < self.num_physical_blocks]
        if out_of_range:
            problems.append(f"block ids {sorted(out_of_range)[:5]} are outside the pool")
        return problems

    def invariants_ok(self) -> bool:
        return not self.invariant_violations()

    # -- internals -----------------------------------------------------------------------------------------

    def _state(self, sequence_id: SequenceId) -> SequenceState:
        try:
            return self.sequences[sequence_id]
        except KeyError:
            if sequence_id in self._released:
                raise UnknownSequenceError(f"sequence {sequence_id!r} was released") from None
            raise UnknownSequenceError(f"unknown sequence {sequence_id!r}") from None

    def _slot(self, state: SequenceState, pos: int) -> int:
        logical_block, block_offset = divmod(pos, self.block_size)
        return state.block_table[logical_block] * self.block_size + block_offset


def _maybe_torch(array: np.ndarray, as_torch: bool) -> Any:
    if not as_torch:
        return array
    import torch  # only the data plane needs torch; the simulator must not import it

    return torch.from_numpy(array)

