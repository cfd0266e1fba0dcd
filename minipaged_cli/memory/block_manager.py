"""The CPU metadata plane: which physical KV block holds which token of which sequence.

A sequence owns logically contiguous token positions; physically its K/V live in fixed-size blocks anywhere in
a pool of ``num_physical_blocks``. For token position ``pos`` of a sequence::

    logical_block  = pos // block_size
    block_offset   = pos %  block_size
    physical_block = block_table[logical_block]
    slot           = physical_block * block_size + block_offset      # what the cache-write kernel receives

Worked example (block_size 4, block_table [5, 2, 9, 1]): token 6 -> logical 1, offset 2, physical 2, slot 10.
(``dataplane/block_tables.py`` turns block tables into the slot mappings and tensors the kernels read.)

Blocks can be shared. Every block has a reference count, the number of block tables holding it:

- ``fork(parent, child)`` gives the child the parent's blocks; the first write into a shared, partly filled
  last block copies it first (copy-on-write, ``fork.py``).
- With ``enable_prefix_caching``, a full block whose content is known gets a chained content hash
  (``hash_blocks``). A sequence created with a prompt shares the longest run of cached full blocks instead of
  allocating them; the last prompt token is always computed, so at most ``(prompt - 1) // block_size`` blocks are
  hits. A block joins the cache only once its K/V is computed (``num_computed_tokens``): a prompt reserved whole
  but prefilled in chunks publishes each block as the step that fills it runs (``mark_computed``).

Freed blocks return to the free queue in vLLM v1's order (``FreeBlockQueue``): a sequence frees its blocks tail
first; those without cached content go to the front (reused next), cached ones to the back (evicted least
recently freed first, and a hit can revive them until then).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

from minipaged_cli.memory.block_pool import BlockPool, num_blocks_for
from minipaged_cli.memory.fork import CopyOnWrite
from minipaged_cli.memory.invariants import block_manager_violations
from minipaged_cli.memory.sequence import (
    DoubleReleaseError,
    DuplicateSequenceError,
    OutOfBlocksError,
    SequenceState,
    UnknownSequenceError,
)

SequenceId = Hashable

# Released ids remembered to name a double release (or a call on a released sequence) as such: a bug shows up
# within a step or two of the release, and a long replay must not keep every id it ever released.
_RELEASED_IDS_KEPT = 1024


def tail_waste(num_tokens: int, block_size: int) -> int:
    """Slots allocated but unused in a sequence's last block: 0 if L % B == 0, else B - L % B."""
    return num_blocks_for(num_tokens, block_size) * block_size - num_tokens


class KVBlockManager(CopyOnWrite):
    """Allocates fixed-size KV blocks to sequences from one pool.

    Invariants (``invariant_violations`` checks them all; property tests check them after every operation):

    - allocated blocks = union of all block tables; a block's reference count equals the number of tables
      holding it (1 unless shared by a fork or a prefix-cache hit), and no table holds a block twice;
    - allocated ∩ free = ∅ and |allocated| + |free| = num_physical_blocks; free blocks have reference count 0;
    - no block appears twice in the free queue, every block id is in [0, num_physical_blocks), and a cached free
      block waits in the queue's back part;
    - every sequence holds ceil(sequence_length / block_size) blocks: a block is taken only when a token needs it;
    - the prefix cache maps a hash to blocks exactly when they carry the hash, and a held hashed block sits where
      its sequence's content has that hash, inside its computed tokens: no entry points at a block whose content
      changed or was never written.

    Every public method either succeeds or raises a ``BlockManagerError`` with the state exactly as before: calls
    count the blocks they need first.
    """

    def __init__(self, num_physical_blocks: int, block_size: int, *, enable_prefix_caching: bool = False) -> None:
        if num_physical_blocks < 1:
            raise ValueError(f"num_physical_blocks must be >= 1, got {num_physical_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        super().__init__()
        self.num_physical_blocks = num_physical_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_physical_blocks, enable_caching=enable_prefix_caching)
        self.sequences: dict[SequenceId, SequenceState] = {}
        self._released: OrderedDict[SequenceId, None] = OrderedDict()  # the last _RELEASED_IDS_KEPT, oldest first

    # -- queries -------------------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.pool.free_blocks.num_free

    @property
    def num_used_blocks(self) -> int:
        """Distinct blocks held by some sequence: a shared block counts once."""
        return self.num_physical_blocks - self.pool.free_blocks.num_free

    @property
    def num_shared_references(self) -> int:
        """Σ (ref_count - 1) over held blocks: table entries that cost no memory (the pool's other counters are
        read from ``pool``)."""
        return self.pool.num_shared_references

    @property
    def num_unfilled_slots(self) -> int:
        """Slots allocated to live sequences but not written yet: the tails of their last blocks, a last block
        shared by forked sequences counted once. (Not internal fragmentation, which counts only the slots a
        request will never fill: Σ max(allocated - final length, 0), ``sim/categories.py``.)"""
        tails = {s.block_table[-1]: len(s.block_table) * self.block_size - s.sequence_length
                 for s in self.sequences.values() if s.block_table}
        return sum(tails.values())

    def sequence(self, sequence_id: SequenceId) -> SequenceState:
        """The live sequence's state; ``UnknownSequenceError`` if there is none."""
        try:
            return self.sequences[sequence_id]
        except KeyError:
            if sequence_id in self._released:
                raise UnknownSequenceError(f"sequence {sequence_id!r} was released") from None
            raise UnknownSequenceError(f"unknown sequence {sequence_id!r}") from None

    def blocks_needed(self, sequence_id: SequenceId | None, num_tokens: int,
                      block_hashes: Sequence[Hashable] = ()) -> int:
        """Blocks the free queue must give to append ``num_tokens`` to the sequence, or (None) to create one
        with a prompt of ``num_tokens`` whose full blocks have ``block_hashes`` (cache hits on held blocks
        take nothing; hits on free cached blocks take those)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if sequence_id is None:
            hits = self._lookup(block_hashes, num_tokens)
            revived = sum(1 for block in hits if self.pool.ref_counts[block] == 0)
            return num_blocks_for(num_tokens, self.block_size) - len(hits) + revived
        state = self.sequence(sequence_id)
        return num_blocks_for(state.sequence_length + num_tokens, self.block_size) - len(state.block_table) + \
            self._needs_copy(state, num_tokens)

    def num_cached_tokens(self, num_tokens: int, block_hashes: Sequence[Hashable]) -> int:
        """Prompt tokens a sequence created now would find in the prefix cache."""
        return len(self._lookup(block_hashes, num_tokens)) * self.block_size

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
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(f"a prompt of {num_prompt_tokens} tokens for sequence {sequence_id!r} needs "
                                   f"{needed} new blocks, {self.num_free_blocks} free")
        for block in hits:
            self.pool.reference(block)
        cached = len(hits) * self.block_size
        state = SequenceState(sequence_id, cached, list(hits), list(block_hashes), cached, cached)
        self.sequences[sequence_id] = state
        self._released.pop(sequence_id, None)
        self.grow(sequence_id, num_prompt_tokens - cached, computed=False)
        self._computed(state, num_computed_tokens)
        return state

    def grow(self, sequence_id: SequenceId, num_tokens: int, *, computed: bool = True) -> SequenceState:
        """Give the sequence's next ``num_tokens`` tokens their slots (a prefill, a decode token), taking a block
        at each block boundary and copying a shared last block before the first write into it; all or nothing.

        ``computed``: every token the sequence holds is written by the step that runs now (a decode, a whole
        prefill); False only reserves the slots, and ``mark_computed`` reports them later.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        state = self.sequence(sequence_id)
        new_length = state.sequence_length + num_tokens
        copy = self._needs_copy(state, num_tokens)
        needed = num_blocks_for(new_length, self.block_size) - len(state.block_table) + copy
        if needed and needed > self.num_free_blocks:  # (most decode steps need no block: skip the count)
            raise OutOfBlocksError(f"{num_tokens} tokens for sequence {sequence_id!r} need {needed} new blocks, "
                                   f"{self.num_free_blocks} free")
        if copy:
            self._copy_last_block(state)
        if needed > copy:
            self.pool.take(needed - copy, state.block_table)
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
        state = self.sequence(sequence_id)
        if not 0 <= num_computed_tokens <= state.sequence_length:
            raise ValueError(f"num_computed_tokens must be in [0, {state.sequence_length}] for sequence "
                             f"{sequence_id!r}, got {num_computed_tokens}")
        self._computed(state, num_computed_tokens)

    def add_block_hashes(self, sequence_id: SequenceId, block_hashes: Iterable[Hashable]) -> None:
        """Append the content hashes of the sequence's next full blocks, as a decode learns its tokens (instead
        of passing them all to ``create_sequence``); blocks already full and computed register at once."""
        state = self.sequence(sequence_id)
        known = len(state.block_hashes)
        state.block_hashes.extend(block_hashes)
        if self.enable_prefix_caching:
            self._register(state, known, state.num_computed_tokens // self.block_size)

    def release_sequence(self, sequence_id: SequenceId) -> None:
        """Drop the sequence's reference to each of its blocks, tail first (vLLM's ``free``, so a chain is evicted
        from its end); a block no one else holds returns to the free queue."""
        if sequence_id in self._released and sequence_id not in self.sequences:
            raise DoubleReleaseError(f"sequence {sequence_id!r} was already released")
        state = self.sequence(sequence_id)
        self.pool.release(state.block_table[::-1])
        del self.sequences[sequence_id]
        self._released[sequence_id] = None
        self._released.move_to_end(sequence_id)  # a forked child may reuse an id released before
        if len(self._released) > _RELEASED_IDS_KEPT:
            self._released.popitem(last=False)

    def reset_prefix_cache(self) -> bool:
        """Drop every prefix-cache entry (after new weights, say). Refuses, returning False and changing nothing,
        while a sequence holds a cached block; True once the cache is empty."""
        return self.pool.reset_cache()

    # -- invariants ----------------------------------------------------------------------------------------

    def invariant_violations(self) -> list[str]:
        """Every broken invariant, each as a sentence naming the bug it points to; empty when all hold."""
        return block_manager_violations(self)

    def invariants_ok(self) -> bool:
        return not self.invariant_violations()

    # -- internals -----------------------------------------------------------------------------------------

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
        """Cache the sequence's blocks ``first`` to ``stop`` (full and computed) under their hashes."""
        stop = min(stop, len(state.block_hashes))
        self.pool.cache(state.block_hashes[first:stop], state.block_table[first:stop])
