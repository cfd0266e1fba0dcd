"""A prefill's new blocks taken and, where they are computed already, cached at once: ``BlockPool.take`` then
``BlockPool.cache_fresh`` over the same blocks, where the block manager would take them and later find them full in
``cache_full_blocks`` (checked against that path: ``tests/memory/test_take_cached.py``). As vLLM, all the taken
blocks' old entries go before the new ones are made (a new key may be one a taken block carried).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minipaged_cli.memory.coordinator import KVCacheCoordinator
    from minipaged_cli.memory.sequence import SequenceState


def take_computed(manager: KVCacheCoordinator, state: SequenceState, count: int, num_computed: int) -> None:
    """Take ``count`` blocks onto the end of the sequence's only table (the caller has checked that they are free);
    under one full-attention group with prefix caching and no fork (no block past those a table offered carries a
    key: ``cache_fresh``), also cache the new blocks that its first ``num_computed`` tokens fill, as the block
    manager's ``cache_full_blocks`` after the take does, counting them as offered. (``note_past_final`` then.)"""
    pool, table = manager.pool, state.block_tables[0]
    first, stop = state.num_cached_blocks[0], min(num_computed // manager.block_size, len(state.block_hashes))
    # (no new block fills, or the pool's own order is wanted: ``cache_full_blocks`` caches them)
    caches_now = not (stop <= len(table) or not manager.enable_prefix_caching or manager.window is not None
                      or manager.num_forks or pool.num_groups > 1 or pool.events.has_subscribers
                      or pool.duplicate_blocks[0])
    pool.take(count, table)
    if caches_now:
        pool.cache_fresh(state.block_hashes[first:stop], table[first:stop])
        state.num_cached_blocks[0] = stop
    note_past_final(manager, (state,))


def note_past_final(manager: KVCacheCoordinator, states: Iterable[SequenceState]) -> None:
    """After a take onto each sequence's only table: list those whose table holds slots past their
    ``final_length`` in ``manager.past_final``."""
    block_size, past_final = manager.block_size, manager.past_final
    for state in states:
        if state.holds_past_final(block_size):
            past_final[state.sequence_id] = state

