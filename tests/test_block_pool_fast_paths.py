"""The block pool's fast paths against its general ones: ``cache_new`` (one dictionary update, for content the
caller knows is fresh) must leave the pool exactly as ``cache`` does, and ``take`` must hand out the back part's
blocks least recently freed first, evicting their content."""

from __future__ import annotations

from minipaged_cli.memory.block_pool import BlockPool


def _pool_with_history() -> BlockPool:
    """A pool whose free queue has all three parts: a cached back (LRU), an uncached front, untouched ids."""
    pool = BlockPool(16, enable_caching=True)
    table: list[int] = []
    pool.take(10, table)  # blocks 0..9
    pool.cache([("a", i) for i in range(6)], table[:6])
    pool.release(table[::-1])  # 5..0 cached to the back (tail first), 9..6 uncached to the front
    pool.lookup([("a", 0), ("a", 1)])  # a memo the new entries must invalidate
    return pool


def _state(pool: BlockPool) -> tuple:
    return (list(pool.cached_blocks.items()), pool.block_hash, pool.duplicate_blocks, pool.cache_version,
            pool.free_blocks.touched(), pool.num_evictions)


def test_cache_new_leaves_the_pool_as_cache_does() -> None:
    by_cache, by_cache_new = _pool_with_history(), _pool_with_history()
    for pool in (by_cache, by_cache_new):
        table: list[int] = []
        pool.take(12, table)  # the 4 front blocks, the 6 untouched ones, then 2 evicted from the back
        assert table == [9, 8, 7, 6, 10, 11, 12, 13, 14, 15, 5, 4]
    fresh_keys = [("b", i) for i in range(5)]
    by_cache.cache(fresh_keys, [9, 10, 11, 5, 4])
    by_cache_new.cache_new(fresh_keys, [9, 10, 11, 5, 4])
    assert _state(by_cache_new) == _state(by_cache)
    # The memo of the lookup before is stale: the new entries are found.
    assert by_cache_new.lookup([("b", 0), ("b", 1)]) == [9, 10]


def test_take_from_the_back_evicts_least_recently_freed_first() -> None:
    pool = _pool_with_history()
    table: list[int] = []
    pool.take(13, table)
    # Released tail first, so block 5 was freed first and goes first; its hash ("a", 5) is no longer cached.
    assert table[-3:] == [5, 4, 3]
    assert pool.num_evictions == 3
    assert sorted(pool.cached_blocks.items()) == [(("a", i), i) for i in range(3)]
    assert pool.free_blocks.touched() == ([], [2, 1, 0])
