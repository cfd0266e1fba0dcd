"""The ``paged`` strategy: blocks of ``block_size`` on demand, through the ``KVBlockManager`` (vLLM)."""

from __future__ import annotations

import numpy as np

from minipaged_cli.memory.allocators import Allocator, BlockCounters, BulkProfile, Holding
from minipaged_cli.memory.block_manager import KVBlockManager, OutOfBlocksError, num_blocks_for


class PagedAllocator(Allocator):
    """Blocks of ``block_size`` on demand; the ``KVBlockManager`` is the source of truth.

    With prefix caching a full block joins the cache when the step that computes it is scheduled, never earlier
    (vLLM's ``cache_blocks``): a prompt admitted whole but prefilled in chunks publishes each chunk's blocks as
    the replay schedules the chunk (``mark_computed``), so a request preempted mid-prefill leaves no block that
    no step wrote in the cache.

    ``scheduler`` is the vLLM engine whose block manager this follows at admission:

    - ``v1`` (``KVCacheManager.allocate_slots``): admission allocates only the blocks of the first chunk
      (``admit``'s ``num_computed``), behind a gate that the whole prompt would fit (``scheduler_reserve_full_isl``);
      the watermark holds only while some sequence runs (``has_scheduled_reqs``), so a prompt is refused only
      when it exceeds the whole pool;
    - ``v0`` (``BlockSpaceManager.can_allocate``): admission allocates the whole prompt and always keeps the
      watermark free.
    """

    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False,
                 watermark_blocks: int = 0, scheduler: str = "v1") -> None:
        super().__init__(num_blocks * block_size)
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks  # admission leaves this many blocks free (vLLM's watermark)
        self.per_chunk = scheduler == "v1"
        self.manager = KVBlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)

    @property
    def supports_prefix_caching(self) -> bool:
        return True

    def _watermark(self) -> int:
        """Blocks admission leaves free now: v1 keeps them only while some sequence runs."""
        return self.watermark_blocks if self.watermark_blocks and (not self.per_chunk or self.manager.sequences) \
            else 0

    def largest_need(self, holding: Holding) -> int:
        return num_blocks_for(holding.final_length, self.block_size) * self.block_size

    def admission_need(self, holding: Holding, prompt_length: int) -> int:
        return num_blocks_for(prompt_length, self.block_size) * self.block_size

    def rejection_reason(self, holding: Holding) -> str | None:
        prompt_blocks = num_blocks_for(holding.prompt_tokens, self.block_size)
        if not self.per_chunk and prompt_blocks > self.manager.num_physical_blocks - self.watermark_blocks:
            return "its prompt needs more blocks than the pool has above the watermark"
        return super().rejection_reason(holding)

    def can_admit(self, holding: Holding, prompt_length: int) -> bool:
        return self.admission_headroom(holding, prompt_length) >= 0

    def admission_headroom(self, holding: Holding, prompt_length: int) -> int:
        needed = self.manager.blocks_needed(None, prompt_length, holding.block_hashes)
        return (self.manager.num_free_blocks - needed - self._watermark()) * self.block_size

    def cached_prefix(self, holding: Holding, prompt_length: int) -> int:
        return self.manager.num_cached_tokens(prompt_length, holding.block_hashes)

    def admit(self, holding: Holding, prompt_length: int, num_computed: int | None = None) -> int:
        if not self.can_admit(holding, prompt_length):
            raise OutOfBlocksError(f"cannot admit {prompt_length} tokens: {self.manager.num_free_blocks} blocks free")
        # v1 allocates (and caches) the first chunk only; its hits are the whole prompt's, since the hit is capped
        # below the chunk's end (``cached_prefix`` < num_computed).
        num_tokens = num_computed if self.per_chunk and num_computed is not None else prompt_length
        state = self.manager.create_sequence(holding.sequence_id, num_tokens, block_hashes=holding.block_hashes,
                                             num_computed_tokens=num_computed)
        return state.num_cached_tokens

    def admit_loading(self, holding: Holding, num_cached: int, num_loaded: int) -> None:
        """Admit with blocks for its ``num_cached`` prefix-cache hits and the ``num_loaded`` tokens after them,
        which a tier below the GPU loads (``sim/tiers.py``): those blocks join the cache once loaded
        (``mark_computed``), as vLLM's ``allocate_slots`` with ``delay_cache_blocks``."""
        self.manager.create_sequence(holding.sequence_id, num_cached + num_loaded, block_hashes=holding.block_hashes,
                                     num_computed_tokens=num_cached)

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

    def block_table(self, sequence_id: int) -> list[int]:
        return self.manager.sequences[sequence_id].block_table

    def counters(self) -> BlockCounters:
        pool = self.manager.pool
        return BlockCounters(pool.num_evictions, self.manager.num_copy_on_writes, pool.num_allocations,
                             pool.num_frees)

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

    def slot_owners(self, slots: np.ndarray) -> np.ndarray:
        """A block several sequences share shows the one listed last (forks, prefix hits)."""
        manager = self.manager
        block_owner = np.full(manager.num_physical_blocks, -1, dtype=np.int64)
        for sequence_id, state in manager.sequences.items():
            block_owner[state.block_table] = sequence_id
        return block_owner[slots // self.block_size]

    def invariant_violations(self) -> list[str]:
        return self.manager.invariant_violations()
