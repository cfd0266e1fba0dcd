"""``BlockPool.release`` of several tables in one call (a sequence's KV cache groups) against a naive model of
vLLM's ``free_blocks`` called once per table, one block at a time: per-block reference counts, and a free queue whose
blocks without cached content go to the front (each call's ahead of the blocks there) and with it to the back. With
and without shared blocks (without, the pool takes its path that tests no block), with and without cached content."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.bulk import release_split

NUM_BLOCKS = 24


def _pool(seed: int, caching: bool, sharing: bool) -> tuple[BlockPool, list[list[int]], list[int], set[int]]:
    """A pool whose blocks are held by three tables, some of them cached; with ``sharing`` some blocks referenced
    twice (a prefix hit). Returns the pool, the tables, the blocks referenced twice and the cached blocks."""
    rng = random.Random(seed)
    pool = BlockPool(NUM_BLOCKS, enable_caching=caching)
    tables: list[list[int]] = [[], [], []]
    for table in tables:
        pool.take(rng.randint(0, 6), table)
    held = [block for table in tables for block in table]
    shared = rng.sample(held, rng.randint(0, len(held))) if sharing else []
    for block in shared:
        pool.reference(block)
    cached = rng.sample(held, rng.randint(0, len(held))) if caching else []
    pool.cache([("content", block) for block in cached], cached)
    return pool, tables, shared, set(cached)


def _naive_release(tables: list[list[int]], shared: list[int], cached: set[int]) -> tuple[dict[int, int], list[int],
                                                                                         list[int]]:
    """Reference counts after the release, and the free queue's front and back parts (it held no touched block
    before), one table and one block at a time."""
    refs = {block: 1 + (block in shared) for table in tables for block in table}
    front: list[int] = []
    back: list[int] = []
    for table in tables:
        to_front = []
        for block in table:
            refs[block] -= 1
            if refs[block] == 0:
                (back if block in cached else to_front).append(block)
        front = to_front + front
    return refs, front, back


@pytest.mark.parametrize("sharing", [False, True])
@pytest.mark.parametrize("caching", [False, True])
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_one_release_of_several_tables_frees_as_vllm_frees_one_table_at_a_time(seed: int, caching: bool,
                                                                               sharing: bool) -> None:
    pool, tables, shared, cached = _pool(seed, caching, sharing)
    parts = [table[::-1] for table in tables]  # each table tail first, as a sequence frees it
    refs, front, back = _naive_release(parts, shared, cached)
    pool.release(*parts)
    assert pool.free_blocks.touched() == (front, back)
    assert [pool.ref_counts[block] for block in refs] == list(refs.values())
    assert pool.num_shared_references == sum(count - 1 for count in refs.values() if count > 1)
    assert pool.num_frees == len(front) + len(back)
    assert len(pool.free_blocks) == NUM_BLOCKS - sum(1 for count in refs.values() if count)


def test_uncached_blocks_of_the_later_table_go_ahead_of_the_earlier_ones() -> None:
    # No prefix caching: everything freed goes to the front, the last table's blocks first (vLLM frees group by
    # group, each call prepending).
    pool = BlockPool(4)
    first, second = [], []
    pool.take(2, first)
    pool.take(2, second)
    pool.release(first[::-1], second[::-1])
    assert pool.free_blocks.touched() == ([3, 2, 1, 0], [])


@pytest.mark.parametrize("sharing", [False, True])
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_a_release_split_by_the_caller_frees_as_vllm_frees_one_table_at_a_time(seed: int, sharing: bool) -> None:
    # ``bulk.release_split``: the caller names each table's keyed blocks (a sequence's cached prefix, possibly
    # shared by a hit) and its keyless ones (the tail after, its own); the pool tests no block for a key.
    rng = random.Random(seed)
    pool = BlockPool(NUM_BLOCKS, enable_caching=True)
    tables: list[list[int]] = [[], [], []]
    splits = []
    for table in tables:
        pool.take(rng.randint(0, 6), table)
        splits.append(rng.randint(0, len(table)))
    keyed_blocks = [block for table, split in zip(tables, splits, strict=True) for block in table[:split]]
    pool.cache([("content", block) for block in keyed_blocks], keyed_blocks)
    shared = rng.sample(keyed_blocks, rng.randint(0, len(keyed_blocks))) if sharing else []
    for block in shared:
        pool.reference(block)
    refs, front, back = _naive_release([table[::-1] for table in tables], shared, set(keyed_blocks))
    release_split(pool, [table[:split][::-1] for table, split in zip(tables, splits, strict=True)],
                       [table[split:][::-1] for table, split in zip(tables, splits, strict=True)])
    assert pool.free_blocks.touched() == (front, back)
    assert [pool.ref_counts[block] for block in refs] == list(refs.values())
    assert pool.num_shared_references == sum(count - 1 for count in refs.values() if count > 1)
    assert pool.num_frees == len(front) + len(back)
