"""The BlockPool under KV cache groups (a cache map per group) against the reference it replaces: one group keyed
by (group, key) pairs, vLLM's ``BlockHashWithGroupId``. Random takes, caching (duplicates included), hits and
releases must leave both with the same free queue, the same cache, the same evictions, and tell a subscriber the
same things."""

from __future__ import annotations

import random

import pytest

from minipaged_cli.memory.block_pool import BlockPool

NUM_GROUPS = 3


class Recorder:
    """A subscriber of a pool's events that keeps every report."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list]] = []

    def cached(self, block_hashes: list, blocks: list[int]) -> None:
        self.calls.append(("cached", list(zip(block_hashes, blocks, strict=True))))

    def evicted(self, block_hashes: list, blocks: list[int]) -> None:
        self.calls.append(("evicted", list(zip(block_hashes, blocks, strict=True))))


def state(pool: BlockPool) -> tuple:
    cached, duplicates, block_keys = pool.keyed_cache()
    return (list(pool.free_blocks), pool.free_blocks.touched(), dict(cached), {k: list(v) for k, v in
            duplicates.items()}, list(block_keys), list(pool.ref_counts), pool.num_evictions, pool.num_allocations,
            pool.num_frees, pool.num_shared_references)


@pytest.mark.parametrize("seed", range(40))
def test_grouped_pool_matches_the_pool_keyed_by_group_and_key(seed: int) -> None:
    rng = random.Random(seed)
    num_blocks = rng.randint(4, 24)
    grouped = BlockPool(num_blocks, num_groups=NUM_GROUPS, enable_caching=True)
    reference = BlockPool(num_blocks, enable_caching=True)
    recorders = Recorder(), Recorder()
    if seed % 2:  # (the grouped pool's events build (group, key) pairs: both ways must report alike)
        grouped.events.subscribe(recorders[0])
        reference.events.subscribe(recorders[1])
    tables: list[tuple[int, list[int]]] = []  # (group, blocks) per live table
    for _ in range(200):
        action = rng.random()
        if action < 0.35 and grouped.free_blocks.num_free:
            count = rng.randint(1, min(4, grouped.free_blocks.num_free))
            group, table, reference_table = rng.randrange(NUM_GROUPS), [], []
            grouped.take(count, table)
            reference.take(count, reference_table)
            assert table == reference_table
            tables.append((group, table))
        elif action < 0.6 and tables:  # cache some of a table's blocks under small keys: hits and duplicates
            group, table = rng.choice(tables)
            blocks = rng.sample(table, rng.randint(1, len(table)))
            keys = [rng.randrange(6) for _ in blocks]
            hashless = all(grouped.block_hash[block] is None for block in blocks)
            if hashless and rng.random() < 0.5:  # (keys new, cached already, or repeated)
                grouped.cache_fresh(keys, blocks, group)
                reference.cache([(group, key) for key in keys], blocks)
            else:
                grouped.cache(keys, blocks, group)
                reference.cache([(group, key) for key in keys], blocks)
        elif action < 0.75:  # a hit: a table of the entry's group references the block a hit gets
            entries = sorted(grouped.keyed_cache()[0].items())
            if entries:
                (group, key), block = rng.choice(entries)
                assert grouped.is_cached((group, key)) and reference.is_cached((group, key))
                assert grouped.cached_blocks[group][key] == reference.cached_blocks[0][(group, key)] == block
                grouped.reference(block)
                reference.reference(block)
                tables.append((group, [block]))
        elif action < 0.97 and tables:
            group, table = tables.pop(rng.randrange(len(tables)))
            grouped.release(table[::-1])
            reference.release(table[::-1])
        elif not tables:
            assert grouped.reset_cache() == reference.reset_cache()
        assert state(grouped) == state(reference)
    assert recorders[0].calls == recorders[1].calls


def test_the_maps_hold_the_callers_keys_themselves() -> None:
    # The point of the layout: caching builds no object per block, the maps hold the very key objects the
    # caller passed (a (group, key) pair per block would be a new object each).
    pool = BlockPool(8, num_groups=2, enable_caching=True)
    table: list[int] = []
    pool.take(4, table)
    keys = [10**30 + i for i in range(4)]  # (ints past the small-int cache: each its own object)
    pool.cache(keys[:2], table[:2], 1)
    pool.cache_fresh(keys[2:], table[2:], 0)
    stored = [*pool.cached_blocks[1], *pool.cached_blocks[0]]
    assert all(held is given for held, given in zip(stored, keys, strict=True))
    assert all(pool.block_hash[block] is key for block, key in zip(table, keys, strict=True))
    assert pool.block_group[:4] == [1, 1, 0, 0] and not pool.cached_blocks[0].keys() & set(keys[:2])


def test_cache_fresh_enters_keyless_blocks_as_cache_does() -> None:
    # Keyless blocks, keys new, cached in the group already, or repeated: the older block keeps the hits, the
    # younger is a duplicate (the hand-worked entries, not the fast path's own answer). Another group's entries
    # do not count.
    pool = BlockPool(8, num_groups=2, enable_caching=True)
    table: list[int] = []
    pool.take(8, table)
    pool.cache_fresh([10, 11], table[:2], 0)
    assert pool.cached_blocks[0] == {10: 0, 11: 1} and pool.block_group[:2] == [0, 0]
    pool.cache_fresh([11, 12], table[2:4], 0)  # 11 is cached (block 1): block 2 becomes its duplicate
    assert pool.cached_blocks[0] == {10: 0, 11: 1, 12: 3} and pool.duplicate_blocks[0] == {11: [2]}
    pool.cache_fresh([10, 10, 11], table[4:7], 1)  # new to group 1; 10 twice: block 4 holds it
    assert pool.cached_blocks[1] == {10: 4, 11: 6} and pool.duplicate_blocks[1] == {10: [5]}
    assert pool.block_hash[:7] == [10, 11, 11, 12, 10, 10, 11] and pool.block_group[:7] == [0, 0, 0, 0, 1, 1, 1]
