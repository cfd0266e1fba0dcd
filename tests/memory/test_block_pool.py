"""The block pool's free queue as ``take`` reads it: the back part's blocks are handed out least recently freed
first, their content evicted. (The caching fast path, ``BlockPool.cache_fresh``:
``tests/memory/test_block_pool_groups.py`` drives it against ``cache``.)"""

from __future__ import annotations

from minipaged_cli.memory.block_pool import BlockPool
from tests.memory.conftest import LOOP_KINDS

pytestmark = LOOP_KINDS  # (each test with the Python loops, then the compiled ones)


def _pool_with_history() -> BlockPool:
    """A pool whose free queue has all three parts: a cached back (LRU), an uncached front, untouched ids."""
    pool = BlockPool(16, enable_caching=True)
    table: list[int] = []
    pool.take(10, table)  # blocks 0..9
    pool.cache([("a", i) for i in range(6)], table[:6])
    pool.release(table[::-1])  # 5..0 cached to the back (tail first), 9..6 uncached to the front
    return pool


def test_take_from_the_back_evicts_least_recently_freed_first() -> None:
    pool = _pool_with_history()
    table: list[int] = []
    pool.take(13, table)
    # Released tail first, so block 5 was freed first and goes first; its hash ("a", 5) is no longer cached.
    assert table[-3:] == [5, 4, 3]
    assert pool.num_evictions == 3
    assert sorted(pool.cached_blocks[0].items()) == [(("a", i), i) for i in range(3)]
    assert pool.free_blocks.touched() == ([], [2, 1, 0])
