"""The single-type managers: what one attention type's KV cache groups hold, and which cached blocks a prompt
can share (vLLM's ``SingleTypeKVCacheManager``s). The ``KVBlockManager`` coordinates one per attention type.

A full-attention group holds every block until the sequence ends, and a prompt shares the longest run of cached
blocks from its start. Latent attention (MLA) is full attention whose page holds the latent vector: the same
manager (``kv_groups.py`` sizes its page). A sliding-window group of window W lets go of the blocks its next token
can no longer see: with C tokens computed, the first ``max(0, C - W + 1) // block_size`` entries; a prompt
shares a cached run that ends where the prompt's hit ends and spans the window::

    block_size 4, W 8, C 14 (tokens 0..13 computed, token 14 next; it sees tokens 7..14)
    skipped = (14 - 8 + 1) // 4 = 1 block       full:    [ 5, 2, 9, 1]
                                                sliding: [ø, 3, 7, 4]   (block 0 held tokens 0..3: freed)

vLLM: v1/core/single_type_kv_cache_manager.py::FullAttentionManager
vLLM: v1/core/single_type_kv_cache_manager.py::SlidingWindowManager
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterable, Sequence

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.sequence import NULL_BLOCK, SequenceState, num_blocks_for


def tail_first(table: list[int], start: int, stop: int) -> list[int]:
    """``table[start:stop]`` last entry first: the order a window's slide and a release free a table's blocks in
    (vLLM frees tail first, so that a prefix's tail is evicted before its head)."""
    return table[stop - 1:start - 1 if start else None:-1] if stop > start else []


def num_free(blocks: Sequence[int], ref_counts: list[int]) -> int:
    """How many of ``blocks`` no table holds (reference count 0). (The counts read in C, not a Python step per
    block: the admission asks about a prompt's hit, tens of blocks, at every check.)"""
    counts = operator.itemgetter(*blocks)(ref_counts) if len(blocks) > 1 else [ref_counts[b] for b in blocks]
    return counts.count(0)


class SingleTypeManager:
    """The KV cache groups ``group_ids`` of one attention type, each a block table per sequence."""

    def __init__(self, group_ids: Sequence[int], block_size: int) -> None:
        self.group_ids = list(group_ids)
        self.block_size = block_size

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks no longer needed once ``num_computed_tokens`` are computed."""
        return 0

    def admission_blocks(self, num_blocks: int, cap: int | None) -> int:
        """Blocks a group of this type counts at the admission gate for a prompt of ``num_blocks`` blocks."""
        return num_blocks

    @staticmethod
    def num_blocks_to_allocate(hits: list[int], num_required: int, num_skipped: int, ref_counts: list[int]) -> int:
        """Free-queue blocks one group takes for a new sequence of ``num_required`` blocks with these ``hits``: new
        blocks past the hit or the skipped ones, plus hits that revive a free cached block.

        vLLM: v1/core/single_type_kv_cache_manager.py::SingleTypeKVCacheManager.get_num_blocks_to_allocate
        """
        blocks = hits[num_skipped:] if num_skipped else hits
        if NULL_BLOCK in blocks:  # (a sliding group's hit may begin with null entries)
            blocks = [block for block in blocks if block != NULL_BLOCK]
        return max(num_required - max(num_skipped, len(hits)), 0) + num_free(blocks, ref_counts)


class FullAttentionManager(SingleTypeManager):
    """The full-attention groups ``group_ids`` (full and latent attention): no block is ever skipped."""

    def find_longest_cache_hit(self, pool: BlockPool, candidates: Iterable[Hashable]) -> list[list[int]]:
        """Per group, the cached blocks of the longest run of ``candidates`` from its start cached in every group
        (all lists of one length; ``candidates`` walked once, up to the first miss).

        vLLM: v1/core/single_type_kv_cache_manager.py::FullAttentionManager.find_longest_cache_hit
        """
        if len(self.group_ids) == 1:
            return [pool.lookup(candidates, self.group_ids[0])]
        gets = [pool.cached_blocks[g].get for g in self.group_ids]
        hits: list[list[int]] = [[] for _ in self.group_ids]
        for block_hash in candidates:
            found = [get(block_hash) for get in gets]
            if None in found:
                break
            for group_hits, block in zip(hits, found, strict=True):
                group_hits.append(block)
        return hits


class SlidingWindowManager(SingleTypeManager):
    """The sliding-window groups ``group_ids``, all of window ``window``: a hit needs the last
    ``hit_run = ceil((W - 1) / block_size)`` blocks before its end cached, and the blocks before them enter the
    table as null blocks. (With W = 1 the run is empty, and vLLM's ``cache_blocks`` caches no block of the group:
    its ``reachable_block_mask`` keeps none.)"""

    def __init__(self, group_ids: Sequence[int], block_size: int, window: int) -> None:
        super().__init__(group_ids, block_size)
        self.window = window
        self.hit_run = num_blocks_for(window - 1, block_size)

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks no longer needed once ``num_computed_tokens`` are computed: the next token sees only the
        last W - 1 of them.

        vLLM: v1/core/single_type_kv_cache_manager.py::SlidingWindowManager.get_num_skipped_tokens
        """
        return max(0, num_computed_tokens - self.window + 1) // self.block_size

    def admission_blocks(self, num_blocks: int, cap: int | None) -> int:
        """At most ``cap`` (vLLM's ``SlidingWindowSpec.max_admission_blocks_per_request``; None: no cap)."""
        return num_blocks if cap is None else min(num_blocks, cap)

    def find_longest_cache_hit(self, pool: BlockPool, candidates: Sequence[Hashable]) -> list[list[int]]:
        """Per group, the blocks a prompt shares (null where it needs none): the last run of ``hit_run`` blocks
        of ``candidates`` cached in every group, searched from the right; with no run that long, the run from the
        start (all lists of one length).

        vLLM: v1/core/single_type_kv_cache_manager.py::SlidingWindowManager.find_longest_cache_hit
        """
        gets = [pool.cached_blocks[g].get for g in self.group_ids]
        run, num_hit = 0, None
        found_at: dict[int, list[int]] = {}
        for i in range(len(candidates) - 1, -1, -1):
            found = [get(candidates[i]) for get in gets]
            if None in found:
                run = 0
                continue
            found_at[i] = found
            run += 1
            if run >= self.hit_run:
                num_hit = i + run
                break
        if num_hit is None:
            num_hit = run
        return [[found_at[i][k] if i in found_at else NULL_BLOCK for i in range(num_hit)]
                for k in range(len(self.group_ids))]

    def remove_skipped_blocks(self, pool: BlockPool, state: SequenceState, num_computed_tokens: int) -> None:
        """Free the blocks that the window no longer reaches with ``num_computed_tokens`` computed, each group's
        last first, as null entries (one call: group by group, as one call each).

        vLLM: v1/core/single_type_kv_cache_manager.py::SlidingWindowManager.remove_skipped_blocks
        """
        skipped = min(self.num_skipped_blocks(num_computed_tokens), len(state.block_tables[self.group_ids[0]]))
        if skipped > state.num_null[self.group_ids[0]]:
            pool.release(*self.null_out(state, skipped))

    def null_out(self, state: SequenceState, skipped: int) -> list[list[int]]:
        """Replace the entries before ``skipped`` with null blocks; the blocks they held, per group, each group's
        last first (for the pool to release). Every sliding group has as many null entries: one counts for all."""
        first = state.num_null[self.group_ids[0]]
        nulls = [NULL_BLOCK] * (skipped - first)
        parts = []
        for g in self.group_ids:
            table = state.block_tables[g]
            parts.append(tail_first(table, first, skipped))
            table[first:skipped] = nulls
            state.num_null[g] = skipped
        state.num_held_blocks -= len(nulls) * len(parts)
        return parts
