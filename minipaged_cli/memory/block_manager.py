"""The CPU metadata plane: which physical KV block holds which token of which sequence.

(Over 300 lines on purpose: one class, ``KVBlockManager``, whose public calls carry the article's and vLLM's names
and docstrings with their units and failure rules; its mechanism lives in ``block_pool``, its checks in
``invariants``, its prefix keys in ``prefix``.)

A sequence owns logically contiguous token positions; physically its K/V live in fixed-size blocks anywhere in
a pool of ``num_physical_blocks``. For token position ``pos`` of a sequence::

    logical_block  = pos // block_size
    block_offset   = pos %  block_size
    physical_block = block_table[logical_block]
    slot           = physical_block * block_size + block_offset      # what the cache-write kernel receives

Worked example (block_size 4, block_table [5, 2, 9, 1]): token 6 -> logical 1, offset 2, physical 2, slot 10.

Blocks can be shared. Every block has a reference count, the number of block tables holding it:

- ``fork(parent, child)`` gives the child the parent's blocks; the first write into a shared, partly filled
  last block copies it first (copy-on-write) and records the (src, dst) pair for the data plane.
- With ``enable_prefix_caching``, a full block whose content is known gets a chained content hash
  (``hash_blocks``: the hash of the parent block's hash and this block's content). A sequence created with a
  prompt shares the longest run of cached full blocks instead of allocating them; the last prompt token is
  always computed, so at most ``(prompt - 1) // block_size`` blocks are hits. A block joins the cache only once
  its K/V is computed (``num_computed_tokens``): a prompt reserved whole but prefilled in chunks publishes each
  block as the step that fills it runs (``mark_computed``), so nobody hits a block no step has written. A freed
  cached block stays in the free queue with its hash and can be revived by a hit until the pool hands it out
  again: the pool hands out blocks without cached content first, and only then evicts a cached one, least
  recently freed first; a sequence frees its tail before its head, so chains are evicted from the tail (vLLM
  v1's order).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minipaged_cli.memory.block_pool import BlockPool, FreeBlockQueue, num_blocks_for
from minipaged_cli.memory.invariants import block_manager_violations
from minipaged_cli.memory.prefix import content_hash, hash_blocks, token_block_contents

__all__ = ["BlockManagerError", "DoubleReleaseError", "DuplicateSequenceError", "FreeBlockQueue", "KVBlockManager",
           "OutOfBlocksError", "SequenceState", "UncomputedForkError", "UnknownSequenceError", "content_hash",
           "hash_blocks", "num_blocks_for", "tail_waste", "token_block_contents"]

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


class UncomputedForkError(BlockManagerError):
    """``fork`` of a sequence whose reserved tokens are not all computed yet."""


@dataclass
class SequenceState:
    """One live sequence: how many tokens it holds and where they are.

    ``sequence_length`` is the number of tokens with a slot, and so the position of the next append.
    ``block_table[i]`` is the physical block holding logical block ``i``. ``block_hashes[i]`` is the chained
    content hash of full block ``i`` where the caller knows its content (prefix caching registers a block under
    it once it is full and computed); ``num_cached_tokens`` are the prompt tokens found in the prefix cache at
    creation; ``num_computed_tokens`` (<= ``sequence_length``) those whose K/V is written: a prompt reserved
    whole and prefilled in chunks holds slots ahead of its computed tokens.
    """

    sequence_id: SequenceId
    sequence_length: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[Hashable] = field(default_factory=list, repr=False)
    num_cached_tokens: int = 0
    num_computed_tokens: int = field(default=0, compare=False)  # progress, not identity: equal states compare equal


def tail_waste(num_tokens: int, block_size: int) -> int:
    """Slots allocated but unused in a sequence's last block: 0 if L % B == 0, else B - L % B."""
    return num_blocks_for(num_tokens, block_size) * block_size - num_tokens


class KVBlockManager:
    """Allocates fixed-size KV blocks to sequences from one pool.

    Invariants (``invariant_violations`` checks them all; property tests check them after every operation):

    - allocated blocks = union of all block tables; a block's reference count equals the number of tables
      holding it (1 unless shared by a fork or a prefix-cache hit), and no table holds a block twice;
    - allocated ∩ free = ∅ and |allocated| + |free| = num_physical_blocks; free blocks have reference count 0;
    - no block appears twice in the free list, and every block id is in [0, num_physical_blocks);
    - every sequence holds ceil(sequence_length / block_size) blocks: a block is taken only when a token needs it;
    - the prefix cache maps a hash to a block exactly when that block carries the hash, and a held hashed block
      sits where its sequence's content has that hash, inside its computed tokens: no entry points at a block
      whose content changed or was never written.

    Every public method either succeeds or raises a ``BlockManagerError`` with the state exactly as before:
    multi-token calls (``append_tokens``, ``slot_mapping_for_append``) count the blocks they need first.
    Freed blocks go to the back of the free queue (``FreeBlockQueue``) and allocation takes from the front, so
    a block just freed is reused last, and a cached block is evicted only when no empty block is left.
    """

    def __init__(self, num_physical_blocks: int, block_size: int, *, enable_prefix_caching: bool = False) -> None:
        if num_physical_blocks < 1:
            raise ValueError(f"num_physical_blocks must be >= 1, got {num_physical_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_physical_blocks = num_physical_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_physical_blocks)
        self.sequences: dict[SequenceId, SequenceState] = {}
        self._released: set[SequenceId] = set()
        self.pending_copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) not yet taken by the data plane
        self.num_copy_on_writes = 0

    # The pool's state under the names the article and earlier versions used.
    free_blocks = property(lambda self: self.pool.free_blocks,
                           lambda self, queue: setattr(self.pool, "free_blocks", queue),
                           doc="The free queue (``FreeBlockQueue``), in hand-out order.")
    ref_counts = property(lambda self: self.pool.ref_counts, doc="Per block: the number of tables holding it.")
    block_hash = property(lambda self: self.pool.block_hash, doc="Per block: the content hash it is cached under.")
    cached_blocks = property(lambda self: self.pool.cached_blocks, doc="Content hash -> the block holding it.")
    num_allocations = property(lambda self: self.pool.num_allocations, doc="Blocks taken from the free queue, ever.")
    num_frees = property(lambda self: self.pool.num_frees, doc="Blocks returned to the free queue, ever.")
    num_evictions = property(lambda self: self.pool.num_evictions,
                             doc="Cached blocks whose content was dropped because the pool handed them out again.")
    num_shared_references = property(lambda self: self.pool.num_shared_references,
                                     doc="Σ (ref_count - 1) over held blocks: table entries that cost no memory.")

    # -- queries -------------------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        """Distinct blocks held by some sequence: a shared block counts once."""
        return self.num_physical_blocks - len(self.free_blocks)

    @property
    def num_evictable_blocks(self) -> int:
        """Free blocks still holding cached content (a hit would revive them); each counted once."""
        return self.free_blocks.num_cached

    def blocks_needed(self, sequence_id: SequenceId | None, num_tokens: int,
                      block_hashes: Sequence[Hashable] = ()) -> int:
        """Blocks the free queue must give to append ``num_tokens`` to the sequence, or (None) to create one
        with a prompt of ``num_tokens`` whose full blocks have ``block_hashes`` (cache hits on held blocks
        take nothing; hits on free cached blocks take those)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if sequence_id is None:
            hits = self._lookup(block_hashes, num_tokens)
            revived = sum(1 for block in hits if self.ref_counts[block] == 0)
            return num_blocks_for(num_tokens, self.block_size) - len(hits) + revived
        state = self._state(sequence_id)
        return num_blocks_for(state.sequence_length + num_tokens, self.block_size) - len(state.block_table) + \
            self._needs_copy(state, num_tokens)

    def can_allocate(self, num_tokens: int, sequence_id: SequenceId | None = None,
                     block_hashes: Sequence[Hashable] = ()) -> bool:
        """Whether ``num_tokens`` more tokens fit: for a new sequence, or appended to ``sequence_id``."""
        return self.blocks_needed(sequence_id, num_tokens, block_hashes) <= len(self.free_blocks)

    def num_cached_tokens(self, num_tokens: int, block_hashes: Sequence[Hashable]) -> int:
        """Prompt tokens a sequence created now would find in the prefix cache."""
        return len(self._lookup(block_hashes, num_tokens)) * self.block_size

    def internal_fragmentation_tokens(self) -> int:
        """Slots allocated to live sequences but not (yet) holding a token: the tails of their last blocks,
        a last block shared by forked sequences counted once."""
        tails: dict[int, int] = {}
        for s in self.sequences.values():
            if s.block_table:
                tails[s.block_table[-1]] = len(s.block_table) * self.block_size - s.sequence_length
        return sum(tails.values())

    # -- lifecycle -----------------------------------------------------------------------------------------

    def create_sequence(self, sequence_id: SequenceId, num_prompt_tokens: int = 0, *,
                        block_hashes: Sequence[Hashable] = (),
                        num_computed_tokens: int | None = None) -> SequenceState:
        """Start a sequence, empty or holding a prompt of ``num_prompt_tokens`` (all of its blocks or none).

        With prefix caching the longest run of the prompt's leading full blocks found by ``block_hashes`` is
        shared rather than allocated (``state.num_cached_tokens``); ``block_hashes`` may run past the prompt
        (the content of tokens still to come; ``add_block_hashes`` adds more later), and blocks register under
        their hash once full and computed. ``num_computed_tokens``: the prompt tokens the step that runs now
        writes (default: all of them); a chunked prefill reserves the whole prompt and reports each chunk with
        ``mark_computed`` as it runs. Cache hits count as computed.
        """
        if sequence_id in self.sequences:
            raise DuplicateSequenceError(f"sequence {sequence_id!r} already exists")
        if num_prompt_tokens < 0:
            raise ValueError(f"num_prompt_tokens must be >= 0, got {num_prompt_tokens}")
        if num_computed_tokens is None:
            num_computed_tokens = num_prompt_tokens
        elif not 0 <= num_computed_tokens <= num_prompt_tokens:
            raise ValueError(f"num_computed_tokens must be in [0, {num_prompt_tokens}], got {num_computed_tokens}")
        hits = self._lookup(block_hashes, num_prompt_tokens)
        needed = self.blocks_needed(None, num_prompt_tokens, block_hashes)
        if needed > len(self.free_blocks):
            raise OutOfBlocksError(f"a prompt of {num_prompt_tokens} tokens for sequence {sequence_id!r} needs "
                                   f"{needed} new blocks, {len(self.free_blocks)} free")
        for block in hits:
            self.pool.reference(block)
        cached = len(hits) * self.block_size
        state = SequenceState(sequence_id, cached, list(hits), list(block_hashes), cached, cached)
        self.sequences[sequence_id] = state
        self._released.discard(sequence_id)
        self.grow(sequence_id, num_prompt_tokens - cached, computed=False)
        self._computed(state, num_computed_tokens)
        return state

    def fork(self, parent_id: SequenceId, child_id: SequenceId, *,
             block_hashes: Sequence[Hashable] | None = None) -> SequenceState:
        """A child sharing every block of the parent (parallel sampling, beam search): no block is copied
        until one of them writes into a shared, partly filled block. ``block_hashes``: the child's content
        hashes (by default the parent's, up to its full blocks, since their continuations differ). The parent's
        tokens must all be computed: a fork shares K/V, not reservations."""
        parent = self._state(parent_id)
        if child_id in self.sequences:
            raise DuplicateSequenceError(f"sequence {child_id!r} already exists")
        if parent.num_computed_tokens < parent.sequence_length:
            raise UncomputedForkError(f"sequence {parent_id!r} has computed {parent.num_computed_tokens} of its "
                                      f"{parent.sequence_length} tokens; fork it once its prefill has run")
        if block_hashes is None:
            block_hashes = parent.block_hashes[: parent.sequence_length // self.block_size]
        for block in parent.block_table:
            self.pool.reference(block)
        child = SequenceState(child_id, parent.sequence_length, list(parent.block_table), list(block_hashes),
                              parent.num_cached_tokens, parent.num_computed_tokens)
        self.sequences[child_id] = child
        self._released.discard(child_id)
        return child

    def append_token(self, sequence_id: SequenceId) -> int:
        """Reserve the slot of the sequence's next token, taking a new block at a block boundary."""
        state = self.grow(sequence_id, 1)
        return self._slot(state, state.sequence_length - 1)

    def append_tokens(self, sequence_id: SequenceId, num_tokens: int) -> list[int]:
        """Reserve the next ``num_tokens`` slots of a sequence (a prefill); all of them or none."""
        start = self._state(sequence_id).sequence_length
        state = self.grow(sequence_id, num_tokens)
        return [self._slot(state, pos) for pos in range(start, start + num_tokens)]

    def grow(self, sequence_id: SequenceId, num_tokens: int, *, computed: bool = True) -> SequenceState:
        """``append_tokens`` without building the slot list, for callers that only track memory (the simulator).

        ``computed``: every token the sequence holds is written by the step that runs now (a decode, a whole
        prefill); False only reserves the slots, and ``mark_computed`` reports them later.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        state = self._state(sequence_id)
        old_length = state.sequence_length
        new_length = old_length + num_tokens
        table = state.block_table
        copy = self._needs_copy(state, num_tokens)
        needed = num_blocks_for(new_length, self.block_size) - len(table) + copy
        if needed and needed > len(self.pool.free_blocks):  # (most decode steps need no block: skip the count)
            raise OutOfBlocksError(
                f"{num_tokens} tokens for sequence {sequence_id!r} need {needed} new blocks, "
                f"{len(self.free_blocks)} free"
            )
        if copy:  # the next token lands in a partly filled block another sequence also holds
            shared = table.pop()
            self.pool.take(1, table)
            self.pool.drop_shared(shared)
            self.pending_copies.append((shared, table[-1]))
            self.num_copy_on_writes += 1
        if needed > copy:
            self.pool.take(needed - copy, table)
        state.sequence_length = new_length
        if computed:
            if self.enable_prefix_caching:
                self._computed(state, new_length)
            else:  # nothing to publish: the count alone (this runs for every decode token)
                state.num_computed_tokens = new_length
        return state

    def mark_computed(self, sequence_id: SequenceId, num_computed_tokens: int) -> None:
        """The sequence's first ``num_computed_tokens`` tokens have their K/V written (the step that wrote them
        has run): full blocks among them join the prefix cache. Never moves backwards."""
        state = self._state(sequence_id)
        if not 0 <= num_computed_tokens <= state.sequence_length:
            raise ValueError(f"num_computed_tokens must be in [0, {state.sequence_length}] for sequence "
                             f"{sequence_id!r}, got {num_computed_tokens}")
        self._computed(state, num_computed_tokens)

    def add_block_hashes(self, sequence_id: SequenceId, block_hashes: Iterable[Hashable]) -> None:
        """Append the content hashes of the sequence's next full blocks, as a decode learns its tokens (instead
        of passing them all to ``create_sequence``); blocks already full and computed register at once."""
        state = self._state(sequence_id)
        known = len(state.block_hashes)
        state.block_hashes.extend(block_hashes)
        if self.enable_prefix_caching:
            self._register(state, known, state.num_computed_tokens // self.block_size)

    def slot_mapping_for_append(self, sequence_ids: Sequence[SequenceId]) -> list[int]:
        """One new token for each listed sequence (a decode step); returns their slots in order.

        Atomic: if the pool cannot serve every sequence, nothing is appended.
        """
        appends: dict[SequenceId, int] = {}
        for sequence_id in sequence_ids:
            appends[sequence_id] = appends.get(sequence_id, 0) + 1
        # Forked siblings sharing a partly filled last block: every writer but the last copies it (the last one
        # then holds it alone), so count the copies against the references each earlier writer gives up.
        given_up: dict[int, int] = {}
        needed = 0
        for sid, n in appends.items():
            state = self._state(sid)
            needed += num_blocks_for(state.sequence_length + n, self.block_size) - len(state.block_table)
            if state.sequence_length % self.block_size:
                last = state.block_table[-1]
                if self.ref_counts[last] - given_up.get(last, 0) > 1:
                    needed += 1
                    given_up[last] = given_up.get(last, 0) + 1
        if needed > len(self.free_blocks):
            raise OutOfBlocksError(
                f"decode step for {len(sequence_ids)} sequences needs {needed} new blocks, "
                f"{len(self.free_blocks)} free"
            )
        return [self.append_token(sid) for sid in sequence_ids]

    def release_sequence(self, sequence_id: SequenceId) -> None:
        """Drop the sequence's reference to each of its blocks; a block no one holds goes to the back of the
        free queue (with prefix caching tail first, so a chain is evicted from its end)."""
        if sequence_id in self._released and sequence_id not in self.sequences:
            raise DoubleReleaseError(f"sequence {sequence_id!r} was already released")
        state = self._state(sequence_id)
        if self.enable_prefix_caching:
            self.pool.release(state.block_table[::-1], keep_cached=True)
        else:
            self.pool.release(state.block_table, keep_cached=False)
        del self.sequences[sequence_id]
        self._released.add(sequence_id)

    def reset_prefix_cache(self) -> bool:
        """Drop every prefix-cache entry (after new weights, say). Refuses, returning False and changing nothing,
        while a sequence holds a cached block, as vLLM does; True once the cache is empty."""
        return self.pool.reset_cache()

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies that copy-on-write decided since the last call; the data plane must
        run them before writing the new tokens."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

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
        return block_manager_violations(self)

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

    def _needs_copy(self, state: SequenceState, num_tokens: int) -> int:
        """1 when the next token would be written into a partly filled block another sequence holds."""
        if num_tokens == 0 or state.sequence_length % self.block_size == 0:
            return 0
        return int(self.ref_counts[state.block_table[-1]] > 1)

    def _lookup(self, block_hashes: Sequence[Hashable], num_tokens: int) -> list[int]:
        """Blocks holding the longest cached run of the prompt's full blocks, leaving the last token to compute."""
        if not self.enable_prefix_caching or num_tokens == 0 or not block_hashes:
            return []
        candidates = block_hashes[: (num_tokens - 1) // self.block_size]
        if not isinstance(candidates, list):  # a list's slice is a copy: the caller's later edits cannot reach it;
            candidates = list(candidates)  # other sequences' slices may be views
        return self.pool.lookup(candidates)

    def _computed(self, state: SequenceState, num_computed_tokens: int) -> None:
        """Advance the sequence's computed tokens; blocks that became full and computed join the cache."""
        first = state.num_computed_tokens // self.block_size
        if num_computed_tokens <= state.num_computed_tokens:
            return
        state.num_computed_tokens = num_computed_tokens
        stop = num_computed_tokens // self.block_size
        if self.enable_prefix_caching and stop > first and len(state.block_hashes) > first:
            self._register(state, first, stop)

    def _register(self, state: SequenceState, first: int, stop: int) -> None:
        """Cache the sequence's blocks ``first`` to ``stop`` (full and computed) under their hashes; the first
        block with some content keeps the entry."""
        stop = min(stop, len(state.block_hashes))
        self.pool.cache(state.block_hashes[first:stop], state.block_table[first:stop])


def _maybe_torch(array: np.ndarray, as_torch: bool) -> Any:
    if not as_torch:
        return array
    import torch  # only the data plane needs torch; the simulator must not import it

    return torch.from_numpy(array)

