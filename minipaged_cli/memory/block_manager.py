"""The CPU metadata plane: which physical KV block holds which token of which sequence.

A sequence owns logically contiguous token positions; physically its K/V live in fixed-size blocks anywhere in
a pool of ``num_physical_blocks``. For token position ``pos`` of a sequence (in each KV cache group)::

    logical_block  = pos // block_size
    block_offset   = pos %  block_size
    physical_block = block_table[logical_block]
    slot           = physical_block * block_size + block_offset      # what the cache-write kernel receives

Worked example (block_size 4, block_table [5, 2, 9, 1]): token 6 -> logical 1, offset 2, physical 2, slot 10.
(``dataplane/block_tables.py`` turns block tables into the slot mappings and tensors the kernels read.)

The manager coordinates one single-type manager per attention type (``single_type.py``) over one pool: each
sequence keeps one block table per KV cache group (``kv_groups.py``), all ``ceil(sequence_length / block_size)``
entries long; a single-group model is one full-attention group. Blocks can be shared: ``fork`` (``fork.py``)
gives a child its parent's blocks, copied on the first write into a shared partly filled block; with prefix
caching a full block whose content is known (``hash_blocks``) joins its group's cache once its K/V is computed,
and a new prompt shares the cached blocks the single-type managers find (at most ``(prompt - 1) // block_size``:
the last prompt token is always computed). Freed blocks return to the one free queue in vLLM's order: tail
first, uncached to the front, cached to the back (evicted least recently freed first; a hit revives them).

vLLM: v1/core/kv_cache_coordinator.py::HybridKVCacheCoordinator
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.coordinator import KVCacheCoordinator
from minipaged_cli.memory.fork import CopyOnWrite
from minipaged_cli.memory.invariants import block_manager_violations
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.memory.sequence import (
    NULL_BLOCK,
    DoubleReleaseError,
    DuplicateSequenceError,
    OutOfBlocksError,
    SequenceState,
    UnknownSequenceError,
    num_blocks_for,
)
from minipaged_cli.memory.take_cached import take_computed
from minipaged_cli.workloads.presets import FULL_ATTENTION

SequenceId = Hashable

# Released ids remembered to name a double release (or a call on a released sequence) as such: a bug shows up
# within a step or two of the release, and a long replay must not keep every id it ever released.
_RELEASED_IDS_KEPT = 1024


class KVBlockManager(CopyOnWrite, KVCacheCoordinator):
    """Allocates fixed-size KV blocks to sequences from one pool, a block table per KV cache group. The rules
    over groups (prefix hits, the blocks a new sequence takes, caching group by group) are the coordinator's
    (``KVCacheCoordinator``); forks and copy-on-write ``CopyOnWrite``'s.

    Invariants (``invariant_violations`` checks them all; property tests check them after every operation):

    - allocated blocks = union of all tables' entries; a block's reference count equals the entries holding it
      (1 unless shared by a fork or a prefix-cache hit), and no sequence holds a block twice;
    - allocated ∩ free = ∅ and |allocated| + |free| = num_physical_blocks; free blocks have reference count 0;
      a cached free block waits in the free queue's back part;
    - every table holds ceil(sequence_length / block_size) entries: a block is taken only when a token needs it;
      null entries only in sliding groups, only as a prefix the window no longer reaches, as many in each;
    - the prefix cache maps a hash to blocks exactly when they carry the hash, and a held hashed block sits where
      its group's content has that hash, inside its computed tokens and the blocks offered to the cache.

    Every public method either succeeds or raises a ``BlockManagerError`` with the state exactly as before: calls
    count the blocks they need first. (``grow`` first slides the windows, as vLLM does even when the allocation
    then fails: that makes room for the retry after a preemption.)

    ``max_in_flight_tokens`` (vLLM's ``max_num_batched_tokens``) and ``max_model_len`` cap what the admission gate
    counts for a sliding group (``admission_cap``); None: no cap.
    """

    def __init__(self, num_physical_blocks: int, block_size: int, groups: Sequence[KVCacheGroup] | None = None, *,
                 enable_prefix_caching: bool = False, max_in_flight_tokens: int | None = None,
                 max_model_len: int | None = None) -> None:
        if num_physical_blocks < 1:
            raise ValueError(f"num_physical_blocks must be >= 1, got {num_physical_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        super().__init__()
        self.groups = tuple(groups) if groups is not None else (KVCacheGroup(FULL_ATTENTION, (), 1),)
        if not self.groups:
            raise ValueError("at least one KV cache group")
        self.num_physical_blocks = num_physical_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_physical_blocks, num_groups=len(self.groups), enable_caching=enable_prefix_caching,
                              keys_by_group=len(self.groups) > 1 or self.groups[0].is_sliding)
        self.sequences: dict[SequenceId, SequenceState] = {}
        KVCacheCoordinator.__init__(self, max_in_flight_tokens, max_model_len)
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
        """Σ (ref_count - 1) over held blocks: table entries that cost no memory."""
        return self.pool.num_shared_references

    @property
    def num_unfilled_slots(self) -> int:
        """Slots allocated to live sequences but not written yet: the tails of their last blocks, a last block
        shared by forked sequences counted once, each group's. (Not internal fragmentation, which counts only the
        slots a request will never fill: ``sim/categories.py``.)"""
        return sum({table[-1]: len(table) * self.block_size - s.sequence_length
                    for s in self.sequences.values() for table in s.block_tables if table}.values())

    def sequence(self, sequence_id: SequenceId) -> SequenceState:
        """The live sequence's state; ``UnknownSequenceError`` if there is none."""
        try:
            return self.sequences[sequence_id]
        except KeyError:
            if sequence_id in self._released:
                raise UnknownSequenceError(f"sequence {sequence_id!r} was released") from None
            raise UnknownSequenceError(f"unknown sequence {sequence_id!r}") from None

    def num_held_blocks(self, sequence_id: SequenceId) -> int:
        """Blocks the sequence holds over all groups (null entries cost nothing)."""
        return self.sequences[sequence_id].num_held_blocks

    def num_held_tokens(self, sequence_id: SequenceId, num_tokens: int) -> int:
        """Of the sequence's first ``num_tokens``, the K/V entries its groups hold: a token counts once per
        group whose table still has its block."""
        if not self.sliding_ids:
            return len(self.groups) * num_tokens
        num_null = self.sequences[sequence_id].num_null[self.sliding_ids[0]]  # (the same in every sliding group)
        return len(self.full_ids) * num_tokens + len(self.sliding_ids) * max(0, num_tokens - num_null * self.block_size)

    def blocks_needed(self, sequence_id: SequenceId | None, num_tokens: int,
                      block_hashes: Sequence[Hashable] = ()) -> int:
        """Blocks the free queue must give to append ``num_tokens`` to the sequence (after its windows slide),
        or (None) the admission gate's count for a prompt of ``num_tokens`` whose full blocks have
        ``block_hashes`` (vLLM's ``full_sequence_must_fit``: hits on held blocks take nothing, hits on free
        cached blocks take those, a sliding group counts at most ``admission_cap``)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if sequence_id is None:
            hits, hit_tokens = self.find_hits(block_hashes, num_tokens)
            return self.blocks_to_allocate(hits, hit_tokens, num_tokens, self.admission_cap)
        state = self.sequence(sequence_id)
        per_group = num_blocks_for(state.sequence_length + num_tokens, self.block_size) - len(state.block_tables[0])
        return per_group * len(self.groups) + self._needs_copy(state, num_tokens)

    # -- lifecycle -----------------------------------------------------------------------------------------

    def create_sequence(self, sequence_id: SequenceId, num_prompt_tokens: int = 0, *,
                        block_hashes: Sequence[Hashable] = (), num_computed_tokens: int | None = None,
                        final_length: int | None = None) -> SequenceState:
        """Start a sequence, empty or holding a prompt of ``num_prompt_tokens`` (all of its blocks in every group,
        or none), sharing its prefix-cache hit (``state.num_cached_tokens``).

        ``block_hashes`` may run past the prompt (the content of tokens still to come; ``add_block_hashes`` adds
        more later), and blocks register under their hash once full and computed. ``num_computed_tokens``: the
        prompt tokens the step that runs now writes (default: all of them); a chunked prefill reserves the whole
        prompt and reports each chunk with ``mark_computed`` as it runs. Cache hits count as computed.
        ``final_length``: the most tokens the sequence will hold, if known (``SequenceState``). In the usual case
        all of it, or all but the search for hits, runs in one compiled call (``pool_loops.create_into``)."""
        if sequence_id in self.sequences:
            raise DuplicateSequenceError(f"sequence {sequence_id!r} already exists")
        if num_prompt_tokens < 0:
            raise ValueError(f"num_prompt_tokens must be >= 0, got {num_prompt_tokens}")
        num_computed_tokens = num_prompt_tokens if num_computed_tokens is None else num_computed_tokens
        if not 0 <= num_computed_tokens <= num_prompt_tokens:
            raise ValueError(f"num_computed_tokens must be in [0, {num_prompt_tokens}], got {num_computed_tokens}")
        args = (self, sequence_id, num_prompt_tokens, block_hashes, num_computed_tokens, final_length)
        if (created := self.pool.loops.create_into(*args, None)) is not False:
            return created
        hits, hit_tokens = self.find_hits(block_hashes, num_prompt_tokens)
        needed = self.blocks_to_allocate(hits, hit_tokens, num_prompt_tokens, None)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(f"a prompt of {num_prompt_tokens} tokens for sequence {sequence_id!r} needs "
                                   f"{needed} new blocks, {self.num_free_blocks} free")
        if hit_tokens and (created := self.pool.loops.create_into(*args, hits[0])) is not False:
            return created
        skipped = self.skipped_blocks(hit_tokens)
        tables, nulls = [], []
        for group, group_hits in zip(self.groups, hits, strict=True):
            num_null = skipped if group.is_sliding else 0
            kept = group_hits[num_null:]
            if kept:  # (most prompts miss: nothing to hold)
                self.pool.reference(*kept)
            tables.append([NULL_BLOCK] * num_null + kept)
            nulls.append(num_null)
        keys = block_hashes if type(block_hashes) is list else list(block_hashes)  # (kept: add_block_hashes copies)
        state = SequenceState(sequence_id, hit_tokens, tables, keys, hit_tokens, hit_tokens, nulls,
                              [len(t) for t in tables], num_held_blocks=sum(map(len, tables)) - sum(nulls),
                              final_length=final_length)
        self.sequences[sequence_id] = state
        self._released.pop(sequence_id, None)
        self._take(state, num_prompt_tokens, 0, num_computed_tokens)
        state.sequence_length = num_prompt_tokens
        self._computed(state, num_computed_tokens)
        return state

    def grow(self, sequence_id: SequenceId, num_tokens: int, *, computed: bool = True) -> SequenceState:
        """Slide the windows, then give the sequence's next ``num_tokens`` tokens their slots in every group (a
        prefill, a decode token), taking a block at each block boundary and copying a shared last block before
        the first write into it; all or nothing.

        ``computed``: every token the sequence holds is written by the step that runs now (a decode, a whole
        prefill); False only reserves the slots, and ``mark_computed`` reports them later.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        state = self.sequence(sequence_id)
        # (The calls only where something happens: most decode steps slide no window and take no block. The
        # window slides once (C - W + 1) // B, the skipped blocks, passes the null entries.)
        if (self.window is not None and state.num_computed_tokens - self.window
                >= (state.num_null[self.sliding_ids[0]] + 1) * self.block_size - 1):
            self.slide_window(sequence_id)
        new_length = state.sequence_length + num_tokens
        copy = self._needs_copy(state, num_tokens)
        if copy or new_length > len(state.block_tables[0]) * self.block_size:
            self._take(state, new_length, copy, new_length if computed else 0)
        state.sequence_length = new_length
        if computed:
            if self.enable_prefix_caching:
                self._computed(state, new_length)
            else:  # nothing to publish: the count alone (this runs for every decode token)
                state.num_computed_tokens = new_length
        return state

    def slide_window(self, sequence_id: SequenceId, num_computed_tokens: int | None = None) -> None:
        """Free the sliding groups' blocks that the window no longer reaches with ``num_computed_tokens``
        (default: the sequence's) computed."""
        state = self.sequences[sequence_id]
        if self.sliding is not None:
            self.sliding.remove_skipped_blocks(self.pool, state, state.num_computed_tokens if num_computed_tokens
                                               is None else num_computed_tokens)

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
        state.block_hashes = [*state.block_hashes, *block_hashes]  # (a new list: the first is the caller's)
        if self.enable_prefix_caching:
            self.cache_full_blocks(state)

    def release_sequence(self, sequence_id: SequenceId) -> None:
        """Drop the sequence's reference to each of its blocks (``release_tables``); a block no one else holds
        returns to the free queue. In the usual case, one compiled call (``pool_loops.release_sequence_into``)."""
        if self.pool.loops.release_sequence_into(self, sequence_id, _RELEASED_IDS_KEPT):
            return
        if sequence_id in self._released and sequence_id not in self.sequences:
            raise DoubleReleaseError(f"sequence {sequence_id!r} was already released")
        self.release_tables(self.sequence(sequence_id))
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

    def _take(self, state: SequenceState, new_length: int, copy: int = 0, num_computed: int = 0) -> None:
        """Extend every table to ``new_length`` tokens, group by group from the free queue, after copying a
        shared last block the next token writes into (``copy``: ``_needs_copy``'s answer); all or nothing. (The
        caller sets the length, then ``_computed(num_computed)``, whose caching ``take_computed`` may do now.)"""
        tables = state.block_tables
        per_group = num_blocks_for(new_length, self.block_size) - len(tables[0])
        needed = per_group * len(tables) + copy
        if needed > self.pool.free_blocks.num_free:
            raise OutOfBlocksError(f"{new_length - state.sequence_length} tokens for sequence "
                                   f"{state.sequence_id!r} need {needed} new blocks, {self.num_free_blocks} free")
        if copy:
            self._copy_last_block(state)
        if per_group <= 0:
            return
        if len(tables) == 1:
            take_computed(self, state, per_group, num_computed)
        else:
            taken: list[int] = []
            self.pool.take(needed, taken)  # (one call: the blocks group by group, as one call per group)
            for g, table in enumerate(tables):
                table += taken[g * per_group:(g + 1) * per_group]
        state.num_held_blocks += per_group * len(tables)

    def _computed(self, state: SequenceState, num_computed_tokens: int) -> None:
        """Advance the computed tokens; blocks that became full and computed join their group's cache."""
        if num_computed_tokens <= state.num_computed_tokens:
            return
        if state.num_loading_tokens:  # (a load's end computes them)
            state.num_loading_tokens = max(0, state.num_computed_tokens + state.num_loading_tokens
                                           - num_computed_tokens)
        state.num_computed_tokens = num_computed_tokens
        # (most decode steps fill no block: the call only when one may join the cache)
        if self.enable_prefix_caching and self.cached_group_ids and \
                num_computed_tokens // self.block_size > state.num_cached_blocks[self.cached_group_ids[0]]:
            self.cache_full_blocks(state)
