"""A prefill's new blocks taken and cached in one call: the fast path of ``BlockPool.take`` followed by
``BlockPool.cache_fresh`` over the same blocks, checked against those two calls (``tests/memory/test_take_cached.py``).

A chunk of a prompt takes its blocks from the free queue (each evicting its old cache entry) and, once computed,
offers its full ones to the cache. As vLLM, all the taken blocks' old entries go before the new ones are made (a new
key may be one a taken block carried): two compiled walks over the same hundreds of blocks, without the calls,
tests and events of the two methods around them.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

from minipaged_cli.memory.block_pool import BlockPool

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
    if (stop <= len(table) or not manager.enable_prefix_caching or manager.window is not None or manager.num_forks
            or pool.num_groups > 1 or pool.events.has_subscribers or pool.duplicate_blocks[0]):
        pool.take(count, table)  # (no new block fills, or the pool's own order is wanted: ``cache_full_blocks``)
    else:
        take_cached(pool, count, table, state.block_hashes[first:stop], first)
        state.num_cached_blocks[0] = stop
    note_past_final(manager, (state,))


def note_past_final(manager: KVCacheCoordinator, states: Iterable[SequenceState]) -> None:
    """After a take onto each sequence's only table: list those whose table holds slots past their
    ``final_length`` in ``manager.past_final``."""
    block_size, past_final = manager.block_size, manager.past_final
    for state in states:
        if state.holds_past_final(block_size):
            past_final[state.sequence_id] = state


def take_cached(pool: BlockPool, count: int, table: list[int], block_hashes: Sequence[Hashable], first: int) -> None:
    """``pool.take(count, table)``, then ``pool.cache_fresh(block_hashes, table[first:first + len(block_hashes)])``:
    one group, no subscriber (a ``KeyLog`` is told the keys those two calls tell it), no duplicate content cached
    (each cached block is its key's entry), the blocks from ``first`` to the take held by the table alone and
    carrying no key."""
    hashes, cached = pool.block_hash, pool.cached_blocks[0]
    blocks, _ = pool.take_free(count)
    log = pool.events.log
    if log is not None:  # (what ``take`` and ``cache_fresh`` log: the old keys, the new)
        log.evicting(blocks, hashes, None)
        log.cached(0, block_hashes)
    table.extend(blocks)
    evicted = pool.drop_entries(blocks)  # (held once, their keys dropped: ``take``'s evictions)
    num_entries = len(cached)
    met = 0
    while (met := pool.loops.enter_keys(hashes, cached, block_hashes, table, first, met)) < len(block_hashes):
        pool.duplicate_blocks[0].setdefault(block_hashes[met], []).append(table[first + met])  # (cached elsewhere)
        met += 1
    pool.num_allocations += count
    if evicted:
        pool.num_evictions += evicted
        pool.cache_version += 1
    pool.cache_version += len(cached) - num_entries
