"""The ``paged`` strategy: blocks of ``block_size`` on demand, through the ``KVBlockManager`` (vLLM).

Under several KV cache groups a slot is one token's K/V in one group (``group_size`` layers' pages,
``kv_groups.py``), so a request of L tokens holds ceil(L / B) blocks in every full-attention group and, in a
sliding-window group, only the blocks its window still reaches. The allocation counts what every group holds; the
token states count each group's copy of a token (``token_slots``), so a sliding group's freed past is neither
allocated nor a token state.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from minipaged_cli.memory import bulk
from minipaged_cli.memory.allocators import Allocator, BlockCounters, BulkProfile, Holding
from minipaged_cli.memory.batched_growth import grow_computed
from minipaged_cli.memory.block_manager import KVBlockManager, OutOfBlocksError, num_blocks_for
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.memory.sequence import NULL_BLOCK


class PagedAllocator(Allocator):
    """Blocks of ``block_size`` on demand; the ``KVBlockManager`` is the source of truth.

    With prefix caching a full block joins the cache when the step that computes it is scheduled, never earlier
    (vLLM's ``cache_blocks``): a prompt admitted whole but prefilled in chunks publishes each chunk's blocks as
    the replay schedules the chunk (``mark_computed``), so a request preempted mid-prefill leaves no block that
    no step wrote in the cache.

    ``max_in_flight_tokens`` (vLLM's ``max_num_batched_tokens``) caps a sliding group's count at the admission
    gate and bounds a first chunk. Admission is the caller's policy: ``admit`` allocates the tokens it is given.
    """

    name = "paged"
    grows_in_batches = True

    def __init__(self, num_blocks: int, block_size: int, groups: Sequence[KVCacheGroup] | None = None, *,
                 prefix_caching: bool = False, max_in_flight_tokens: int | None = None,
                 max_model_len: int | None = None) -> None:
        super().__init__(num_blocks * block_size)
        self.block_size = block_size
        self.manager = KVBlockManager(num_blocks, block_size, groups, enable_prefix_caching=prefix_caching,
                                      max_in_flight_tokens=max_in_flight_tokens, max_model_len=max_model_len)
        self.num_groups = len(self.manager.groups)
        self.num_sliding = len(self.manager.sliding_ids)
        self.windowed = self.num_groups > 1 or self.num_sliding > 0
        self.max_chunk = max_in_flight_tokens

    @property
    def supports_prefix_caching(self) -> bool:
        return True

    def largest_need(self, holding: Holding) -> int:
        blocks = num_blocks_for(holding.final_length, self.block_size)
        sliding = min(blocks, self.manager.admission_cap or blocks)
        return ((self.num_groups - self.num_sliding) * blocks + self.num_sliding * sliding) * self.block_size

    def admission_need(self, holding: Holding, prompt_length: int) -> int:
        return num_blocks_for(prompt_length, self.block_size) * self.block_size

    def blocks_to_admit(self, holding: Holding, prompt_length: int) -> int:
        """Free blocks admitting the prompt takes: vLLM's gate (the whole prompt, a window capped), and under a
        sliding window the first chunk's allocation too, which may need more than its capped gate count (the
        chunk at its largest, the step's token budget past the cached prefix)."""
        manager, hashes = self.manager, holding.block_hashes
        if manager.sliding is None:  # (a full-attention chunk never needs more than the whole prompt)
            return manager.blocks_needed(None, prompt_length, hashes)
        hits, cached = manager.find_hits(hashes, prompt_length)
        gate = manager.blocks_to_allocate(hits, cached, prompt_length, manager.admission_cap)
        first_chunk = min(prompt_length, cached + (self.max_chunk or prompt_length))
        chunk = manager.blocks_to_allocate(hits, cached, prompt_length, None) if first_chunk == prompt_length \
            else manager.blocks_to_create(first_chunk, hashes)
        return max(gate, chunk)

    def admission_headroom(self, holding: Holding, prompt_length: int, keep_free_blocks: int = 0) -> int:
        # (asked several times a step: one compiled call where no group slides, with one group its hit too)
        manager = self.manager
        headroom = manager.pool.loops.admission_headroom(manager, holding.block_hashes, prompt_length,
                                                         keep_free_blocks)
        if headroom is not None:
            return headroom
        return (manager.num_free_blocks - self.blocks_to_admit(holding, prompt_length) - keep_free_blocks) \
            * self.block_size

    def can_admit(self, holding: Holding, prompt_length: int, keep_free_blocks: int = 0) -> bool:
        return self.admission_headroom(holding, prompt_length, keep_free_blocks) >= 0

    def rejection_reason(self, holding: Holding, watermark_blocks: int | None = None) -> str | None:
        if watermark_blocks is not None and num_blocks_for(holding.prompt_tokens, self.block_size) > \
                self.manager.num_physical_blocks - watermark_blocks:
            return "its prompt needs more blocks than the pool has above the watermark"
        return super().rejection_reason(holding)

    def cached_prefix(self, holding: Holding, prompt_length: int) -> int:
        return self.manager.num_cached_tokens(prompt_length, holding.block_hashes)

    def admit(self, holding: Holding, prompt_length: int, num_computed: int | None = None, *,
              first_chunk_only: bool = False) -> int:
        # The first chunk's hits are the whole prompt's: the hit is capped below the chunk's end (``cached_prefix``
        # < num_computed).
        num_tokens = num_computed if first_chunk_only and num_computed is not None else prompt_length
        try:
            state = self.manager.create_sequence(holding.sequence_id, num_tokens, block_hashes=holding.block_hashes,
                                                 num_computed_tokens=num_computed, final_length=holding.final_length)
        except OutOfBlocksError:
            raise OutOfBlocksError(f"cannot admit {prompt_length} tokens: {self.manager.num_free_blocks} blocks "
                                   "free") from None
        return state.num_cached_tokens

    def admit_loading(self, holding: Holding, num_cached: int, num_loaded: int) -> None:
        """Admit with blocks for its ``num_cached`` prefix-cache hits and the ``num_loaded`` tokens after them,
        which a tier below the GPU loads (``sim/tiers.py``): those blocks join the cache once loaded
        (``mark_computed``), as vLLM's ``allocate_slots`` with ``delay_cache_blocks``. A sliding group holds
        blocks only for the window at the load's end (vLLM's connector loads no more; the entries before are
        null blocks): taken a window at a time, the blocks the window has passed let go before the next take."""
        manager, sequence_id = self.manager, holding.sequence_id
        if manager.window is None:
            manager.create_sequence(sequence_id, num_cached + num_loaded, block_hashes=holding.block_hashes,
                                    num_computed_tokens=num_cached, final_length=holding.final_length)
            return
        # (one token past the hit: the hit is looked up as for the whole prompt, whose last token is computed)
        length, end = num_cached + 1, num_cached + num_loaded
        state = manager.create_sequence(sequence_id, length, block_hashes=holding.block_hashes,
                                        num_computed_tokens=num_cached, final_length=holding.final_length)
        state.num_loading_tokens = num_loaded
        step = max(manager.window, self.block_size)
        while length < end:
            manager.slide_window(sequence_id, length)
            grown = min(length + step, end)
            manager.grow(sequence_id, grown - length, computed=False)
            length = grown
        manager.slide_window(sequence_id, end)

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

    def grow_decodes(self, holdings: Sequence[Holding]) -> int:
        return grow_computed(self.manager, holdings, 1)

    def mark_computed(self, holding: Holding, num_computed: int) -> None:
        self.manager.mark_computed(holding.sequence_id, num_computed)

    def name_private(self, holding: Holding, block_hashes: list[Hashable]) -> None:
        self.manager.name_private(self.manager.sequence(holding.sequence_id), block_hashes)

    def release(self, holding: Holding) -> None:
        self.manager.release_sequence(holding.sequence_id)

    def allocated(self, holding: Holding) -> int:
        return self.manager.sequences[holding.sequence_id].num_held_blocks * self.block_size

    def allocations(self, holdings: Sequence[Holding]) -> list[int]:
        sequences, block_size = self.manager.sequences, self.block_size
        return [sequences[holding.sequence_id].num_held_blocks * block_size for holding in holdings]

    def allocation_sums(self, holdings: Sequence[Holding]) -> tuple[int, int]:
        """Where the holdings are all the live sequences (as many, each live), of one full-attention table each and
        no fork: Σ allocated is every table entry, the pool's blocks in use and shared references, and the slots past
        the final lengths are those of the few sequences the manager lists in their last block (``past_final``), in
        place of a pass over all (the accounting asks every step); else the sums over ``holdings``, the reference
        (``tests/memory/test_paged.py`` checks the two agree)."""
        manager, block_size = self.manager, self.block_size
        if self._all_live(holdings):
            return (manager.num_used_blocks + manager.num_shared_references) * block_size, \
                sum([len(state.block_tables[0]) * block_size - state.final_length  # type: ignore[operator]
                     for state in manager.past_final.values()])
        return super().allocation_sums(holdings)

    def bulk_allocations(self, holdings: Sequence[Holding]) -> int:
        """Σ allocated alone (the profiles read only the sum): the pool's count, where ``allocation_sums`` reads it."""
        if self._all_live(holdings):
            return (self.manager.num_used_blocks + self.manager.num_shared_references) * self.block_size
        return self.allocation_sums(holdings)[0]

    def full_attention_pool(self, holdings: Sequence[Holding]) -> tuple[int, int, int] | None:
        if self.windowed:
            return None
        return self.block_size, self.manager.num_free_blocks, self.bulk_allocations(holdings)

    def _all_live(self, holdings: Sequence[Holding]) -> bool:
        """Whether ``holdings`` are all the live sequences (as many, each live), of one full-attention table each and
        no fork: where the pool's counts are their sums."""
        return not self.windowed and not self.manager.num_forks and len(holdings) == len(self.manager.sequences)

    def token_slots(self, holding: Holding, num_tokens: int) -> int:
        return self.manager.num_held_tokens(holding.sequence_id, num_tokens)

    def internal_slots(self, holding: Holding) -> int:
        state = self.manager.sequences[holding.sequence_id]
        return self.num_groups * max(len(state.block_tables[0]) * self.block_size - holding.final_length, 0)

    def block_table(self, sequence_id: int) -> list[int]:
        if self.num_groups > 1:
            raise NotImplementedError("a model with KV cache groups has a block table per group; the data plane "
                                      "runs full-attention models (--no-hybrid-kv)")
        return self.manager.sequences[sequence_id].block_tables[0]

    def counters(self) -> BlockCounters:
        pool = self.manager.pool
        return BlockCounters(pool.num_evictions, self.manager.num_copy_on_writes, pool.num_allocations,
                             pool.num_frees)

    @property
    def used_slots(self) -> int:
        return self.manager.num_used_blocks * self.block_size

    def bulk_profile(self, lengths: np.ndarray, allocated: np.ndarray | int, finals: np.ndarray,
                     num_steps: int) -> BulkProfile:
        if self.windowed:
            return bulk.windowed_profile(self.manager, lengths, allocated, finals, num_steps)
        return bulk.full_attention_profile(self.block_size, self.manager.num_free_blocks, lengths, allocated, finals,
                                           num_steps)

    def advance(self, holdings: list[Holding], num_steps: int) -> None:
        if self.manager.window is None:
            if self.grows_in_batches:
                grow_computed(self.manager, holdings, num_steps)  # (the profile's steps fit: all grow)
            else:
                for holding in holdings:
                    self.manager.grow(holding.sequence_id, num_steps)
            return
        bulk.advance_windowed(self.manager, [holding.sequence_id for holding in holdings], num_steps)

    def slot_owners(self, slots: np.ndarray) -> np.ndarray:
        """A block several sequences share shows the one listed last (forks, prefix hits). Costs the blocks in
        use and the slots asked, never the pool's size (``--num-blocks`` may be in the millions)."""
        block_owner = {block: sequence_id for sequence_id, state in self.manager.sequences.items()
                       for table in state.block_tables for block in table if block != NULL_BLOCK}
        return np.array([block_owner.get(block, -1) for block in (slots // self.block_size).tolist()],
                        dtype=np.int64)

    def invariant_violations(self) -> list[str]:
        return self.manager.invariant_violations()
