"""``BlockPool.release`` of several tables in one call (a sequence's KV cache groups) against one call per table:
the same free queue (front and back order), reference counts and counters, with and without cached content and
shared blocks."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.block_pool import BlockPool

NUM_BLOCKS = 24


def _pool(seed: int, caching: bool) -> tuple[BlockPool, list[list[int]]]:
    """A pool whose blocks are held by three tables (some blocks referenced twice: shared), some of them cached."""
    rng = random.Random(seed)
    pool = BlockPool(NUM_BLOCKS, enable_caching=caching)
    tables: list[list[int]] = [[], [], []]
    for table in tables:
        pool.take(rng.randint(0, 6), table)
    held = [block for table in tables for block in table]
    for block in rng.sample(held, len(held) // 3):  # (a prefix hit shares a block: one more reference)
        pool.reference(block)
    if caching:
        cached = rng.sample(held, len(held) // 2)
        pool.cache([("content", block) for block in cached], cached)
    return pool, tables


def _state(pool: BlockPool) -> tuple:
    return (list(pool.free_blocks), pool.free_blocks.touched(), pool.ref_counts, pool.num_shared_references,
            pool.num_frees)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6), st.booleans())
def test_one_release_of_several_tables_frees_as_one_call_per_table(seed: int, caching: bool) -> None:
    at_once, one_by_one = _pool(seed, caching), _pool(seed, caching)
    parts = [table[::-1] for table in at_once[1]]  # each table tail first, as a sequence frees it
    at_once[0].release(*parts)
    for part in parts:
        one_by_one[0].release(part)
    assert _state(at_once[0]) == _state(one_by_one[0])


def test_uncached_blocks_of_the_later_table_go_ahead_of_the_earlier_ones() -> None:
    # No prefix caching: everything freed goes to the front, the last table's blocks first (vLLM frees group by
    # group, each call prepending).
    pool = BlockPool(4)
    first, second = [], []
    pool.take(2, first)
    pool.take(2, second)
    pool.release(first[::-1], second[::-1])
    assert pool.free_blocks.touched() == ([3, 2, 1, 0], [])
