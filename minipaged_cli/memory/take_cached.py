"""A prefill's new blocks taken and cached in one pass: the fast path of ``BlockPool.take`` followed by
``BlockPool.cache_fresh`` over the same blocks, checked against those two calls (``tests/memory/test_take_cached.py``).

A chunk of a prompt takes its blocks from the free queue (each evicting its old cache entry) and, once computed,
offers its full ones to the cache: two walks over the same hundreds of blocks. vLLM evicts all the taken blocks'
old entries before caching the new ones, and a new key may be one a taken block still carries; one pass keeps that
order's result by handing the entry straight to the new block where it meets one (``_evict_for``).
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
    """``pool.take(count, table)``, then ``pool.cache_fresh(block_hashes, table[first:first + len(block_hashes)])``
    in one pass over the blocks: one group, no subscriber (a ``KeyLog`` is told the keys those two calls tell it),
    no duplicate content cached (each cached block is its key's entry), the blocks from ``first`` to the take held
    by the table alone and carrying no key."""
    refs, hashes, cached = pool.ref_counts, pool.block_hash, pool.cached_blocks[0]
    blocks, _ = pool.take_free(count)
    log = pool.events.log
    if log is not None:  # (what ``take`` and ``cache_fresh`` log: the old keys, the new)
        log.evicting(blocks, hashes, None)
        log.cached(0, block_hashes)
    table.extend(blocks)
    num_entries = len(cached)
    dropped, private = pool.loops.count_keys(hashes, blocks)  # (each taken block that carries a key loses it)
    met = 0
    while (met := pool.loops.enter_keys(refs, hashes, cached, block_hashes, table, first, met)) < len(block_hashes):
        _evict_for(pool, block_hashes[met], table[first + met], blocks)  # (met an entry: rare)
        met += 1
    pool.drop_entries(blocks[max(first + len(block_hashes) - (len(table) - count), 0):])  # (taken, not cached)
    # (the taken blocks' entries are dropped, so the change in size is the entries made less those: ``cache_fresh``
    # counts the same; ``PRIVATE`` makes none)
    num_new = len(cached) - num_entries + dropped
    evicted = dropped + private
    pool.num_allocations += count
    if evicted:
        pool.num_evictions += evicted
        pool.cache_version += 1
    pool.cache_version += num_new


def _evict_for(pool: BlockPool, key: Hashable, block: int, taken: list[int]) -> None:
    """``key``'s entry met in the pass, for ``block``: where it is a taken block's old entry, not evicted yet, it is
    evicted now and ``block`` takes the key (as evicting all first, then caching, leaves it). Else ``block`` holds
    the content a second time (``cache_fresh``'s duplicate)."""
    cached, hashes = pool.cached_blocks[0], pool.block_hash
    other = cached[key]
    if not pool.ref_counts[other] and other in taken:  # (a taken block not reached yet: still free, count 0)
        hashes[other] = None
        cached[key] = block
        return
    pool.duplicate_blocks[0].setdefault(key, []).append(block)
