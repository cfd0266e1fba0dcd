"""The ``paged`` strategy for a model with KV cache groups: ``PagedAllocator`` over the ``HybridBlockManager``.

A slot is one token's K/V in one group (``group_size`` layers' pages, ``kv_groups.py``), so a request of L tokens
holds ceil(L / B) blocks in every full-attention group and, in a sliding-window group, only the blocks its window
still reaches. The allocation counts what every group holds; the token states count each group's copy of a token
(``token_slots``), so a sliding group's freed past is neither allocated nor a token state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minipaged_cli.memory.allocators import BulkProfile, Holding
from minipaged_cli.memory.block_pool import num_blocks_for
from minipaged_cli.memory.hybrid import NULL_BLOCK, HybridBlockManager
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.memory.paged import PagedAllocator


class HybridPagedAllocator(PagedAllocator):
    """Blocks on demand in every KV cache group (vLLM v1's hybrid KV cache manager; v1 scheduling only: v0 had
    none). ``max_in_flight_tokens``: vLLM's ``max_num_batched_tokens``, which caps a sliding group's count at the
    admission gate."""

    windowed = True

    def __init__(self, num_blocks: int, block_size: int, groups: Sequence[KVCacheGroup], *,
                 prefix_caching: bool = False, watermark_blocks: int = 0, max_in_flight_tokens: int,
                 max_model_len: int) -> None:
        super().__init__(num_blocks, block_size, prefix_caching=prefix_caching, watermark_blocks=watermark_blocks)
        self.manager = HybridBlockManager(num_blocks, block_size, groups, enable_prefix_caching=prefix_caching,
                                          max_in_flight_tokens=max_in_flight_tokens, max_model_len=max_model_len)
        self.num_groups = len(groups)
        self.num_sliding = len(self.manager.sliding_ids)
        self.max_chunk = max_in_flight_tokens

    def admission_headroom(self, holding: Holding, prompt_length: int) -> int:
        """vLLM admits when both its gate (the whole prompt, a window capped) and the first chunk's allocation
        fit; a sliding group's chunk may need more than its capped gate count, so both are counted (the chunk at
        its largest, the step's token budget past the cached prefix)."""
        manager, hashes = self.manager, holding.block_hashes
        hits, cached = manager.find_hits(hashes, prompt_length)
        gate = manager.blocks_to_allocate(hits, cached, prompt_length, manager.admission_cap)  # (``blocks_needed``)
        first_chunk = min(prompt_length, cached + self.max_chunk)
        chunk = manager.blocks_to_allocate(hits, cached, prompt_length, None) if first_chunk == prompt_length \
            else manager.blocks_to_create(first_chunk, hashes)  # (``blocks_to_create``, its hits found once)
        return (manager.num_free_blocks - max(gate, chunk) - self._watermark()) * self.block_size

    def admit_loading(self, holding: Holding, num_cached: int, num_loaded: int) -> None:
        """As ``PagedAllocator.admit_loading``, but a sliding group holds blocks only for the window at the
        load's end (vLLM's connector loads no more; the entries before are null blocks). Taken a window at a time,
        the blocks the window has passed let go before the next take, so that no more is held at once than a
        window and a step's worth."""
        manager, sequence_id = self.manager, holding.sequence_id
        # (one token past the hit: the hit is looked up as for the whole prompt, whose last token is computed)
        length, end = num_cached + 1, num_cached + num_loaded
        state = manager.create_sequence(sequence_id, length, block_hashes=holding.block_hashes,
                                        num_computed_tokens=num_cached)
        state.num_loading_tokens = num_loaded
        step = max(manager.window or 0, self.block_size)
        while length < end:
            manager.slide_window(sequence_id, length)
            grown = min(length + step, end)
            manager.grow(sequence_id, grown - length, computed=False)
            length = grown
        manager.slide_window(sequence_id, end)

    def largest_need(self, holding: Holding) -> int:
        blocks = num_blocks_for(holding.final_length, self.block_size)
        sliding = min(blocks, self.manager.admission_cap or blocks)
        return ((self.num_groups - self.num_sliding) * blocks + self.num_sliding * sliding) * self.block_size

    def allocated(self, holding: Holding) -> int:
        return self.manager.sequences[holding.sequence_id].num_held_blocks * self.block_size

    def token_slots(self, holding: Holding, num_tokens: int) -> int:
        return self.manager.num_held_tokens(holding.sequence_id, num_tokens)

    def internal_slots(self, holding: Holding) -> int:
        state = self.manager.sequences[holding.sequence_id]
        return self.num_groups * max(len(state.block_tables[0]) * self.block_size - holding.final_length, 0)

    def block_table(self, sequence_id: int) -> list[int]:
        raise NotImplementedError("a model with KV cache groups has a block table per group; the data plane runs "
                                  "full-attention models (--no-hybrid-kv)")

    def bulk_profile(self, lengths: np.ndarray, allocated: np.ndarray, finals: np.ndarray,
                     num_steps: int) -> BulkProfile:
        # During step j a request of length L_j = L + j (after the step's growth) holds ceil(L_j / B) entries per
        # group; a sliding group slid with L_j - 1 computed, so max(0, L_j - W) // B of them are null blocks. (As
        # few numpy calls as it takes: at a handful of running requests each call's fixed cost is most of the time.)
        block_size, window, groups, sliding = self.block_size, self.manager.window, self.num_groups, self.num_sliding
        length_matrix = lengths[:, None] + np.arange(1, num_steps + 1, dtype=np.int64)  # [n, k]
        entry_slots = (length_matrix + (block_size - 1)) // block_size * block_size  # [n, k] a group's entries
        skipped = (length_matrix - window) // block_size
        np.maximum(skipped, 0, out=skipped)
        skipped_slots = sliding * block_size * np.add.reduce(skipped, axis=0)  # [k] the null entries' slots
        # (``np.add.reduce``: ``ndarray.sum`` goes through a Python wrapper)
        allocated_slots = groups * np.add.reduce(entry_slots, axis=0) - skipped_slots  # [k]
        # Safe to take in bulk while each step's new blocks fit before any of that step's windows slide; all of
        # them when the new entries of every step fit at once (what the windows free meanwhile only helps). A
        # request takes at most k // B + 1 entries per group: the exact count only where that many may not fit.
        num_ok = num_steps
        free = self.manager.num_free_blocks
        if groups * len(lengths) * (num_steps // block_size + 1) > free:
            entries_sum = np.add.reduce(entry_slots, axis=0) // block_size  # [k]
            entries_now = int(np.add.reduce((lengths + (block_size - 1)) // block_size))
            if groups * (int(entries_sum[-1]) - entries_now) > free:
                net = (allocated_slots - int(allocated.sum())) // block_size  # [k] blocks taken minus freed by then
                new_entries = groups * np.diff(entries_sum, prepend=entries_now)
                fits = np.concatenate(([0], net[:-1])) + new_entries <= free
                num_ok = int(np.argmin(fits)) if not fits.all() else num_steps
        if num_ok < num_steps:
            length_matrix, entry_slots = length_matrix[:, :num_ok], entry_slots[:, :num_ok]
            skipped_slots, allocated_slots = skipped_slots[:num_ok], allocated_slots[:num_ok]
        internal = groups * np.add.reduce(np.maximum(entry_slots - finals[:, None], 0), axis=0)
        tokens = groups * np.add.reduce(length_matrix, axis=0) - skipped_slots
        return BulkProfile(num_ok, allocated_slots, internal, tokens)

    def advance(self, holdings: list[Holding], num_steps: int) -> None:
        """The decode steps in lockstep where it matters, so that the pool's history (which blocks are taken,
        freed, evicted, in which order) is what single steps make: at a request's block events, in the running
        order - a window skip (caught up to L + j - 1, then ``slide_window`` as step j's grow slides; step 1 too,
        for the slide a just-finished prefill left) and a new block (``grow`` up to L + j). In between a request's
        length changes and its filled blocks are cached, nothing else."""
        manager, block_size, window = self.manager, self.block_size, self.manager.window
        if manager.decode_in_bulk([holding.sequence_id for holding in holdings], num_steps):
            return
        events = []  # (step, position in the running order, sequence id, new block)
        for order, holding in enumerate(holdings):
            length = manager.sequences[holding.sequence_id].sequence_length
            first_new = (1 - length) % block_size or block_size  # step j takes a block when L + j - 1 = 0 mod B
            first_skip = (window - length) % block_size or block_size  # and skips one when L + j - W = 0 mod B
            new = range(first_new, num_steps + 1, block_size)
            events += [(step, order, holding.sequence_id, True) for step in new]
            events += [(step, order, holding.sequence_id, False)
                       for step in {1, *range(first_skip, num_steps + 1, block_size)}]
        done = {holding.sequence_id: 0 for holding in holdings}
        for step, _, sequence_id, new_block in sorted(events, key=lambda e: (*e[:2], e[3])):
            if new_block:  # (after the same step's slide: a step slides, then takes)
                manager.grow(sequence_id, step - done[sequence_id])
                done[sequence_id] = step
                continue
            if step - 1 > done[sequence_id]:  # the blocks that filled meanwhile are cached before any is freed
                manager.grow(sequence_id, step - 1 - done[sequence_id])
                done[sequence_id] = step - 1
            manager.slide_window(sequence_id)
        for sequence_id, steps_done in done.items():
            if steps_done < num_steps:
                manager.grow(sequence_id, num_steps - steps_done)

    def slot_owners(self, slots: np.ndarray) -> np.ndarray:
        block_owner = np.full(self.manager.num_physical_blocks, -1, dtype=np.int64)
        for sequence_id, state in self.manager.sequences.items():
            for table in state.block_tables:
                held = [block for block in table if block != NULL_BLOCK]
                block_owner[held] = sequence_id
        return block_owner[slots // self.block_size]
