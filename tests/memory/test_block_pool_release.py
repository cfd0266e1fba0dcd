"""``BlockPool.release`` of several tables in one call (a sequence's KV cache groups) against a naive model of
vLLM's ``free_blocks`` called once per table, one block at a time: per-block reference counts, and a free queue whose
blocks without cached content go to the front (each call's ahead of the blocks there) and with it to the back. With
and without shared blocks (without, the pool takes its path that tests no block), with and without cached content."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.block_pool import BlockPool
from tests.memory.conftest import LOOP_KINDS
from tests.memory.test_bulk import prompts_sharing_documents

pytestmark = LOOP_KINDS  # (each test with the Python loops, then the compiled ones)

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
def test_a_release_split_by_the_caller_frees_as_vllm_frees_one_table_at_a_time(
        seed: int, sharing: bool) -> None:
    # ``BlockPool.release_split`` (a bulk decode's windows, a sequence's release): the
    # caller names each table's keyed blocks (a sequence's cached prefix, possibly shared by a hit) and its keyless
    # ones (the tail after, its own); the pool tests no block for a key.
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
    pool.release_split([table[:split][::-1] for table, split in zip(tables, splits, strict=True)],
                       [table[split:][::-1] for table, split in zip(tables, splits, strict=True)])
    assert pool.free_blocks.touched() == (front, back)
    assert [pool.ref_counts[block] for block in refs] == list(refs.values())
    assert pool.num_shared_references == sum(count - 1 for count in refs.values() if count > 1)
    assert pool.num_frees == len(front) + len(back)


@pytest.mark.parametrize("sharing", [False, True])
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_a_tables_release_split_at_its_keyed_blocks_frees_as_release(seed: int, sharing: bool) -> None:
    # ``BlockPool.release_split``: one table whose first blocks carry a key (those it offered to the cache, some
    # shared by a hit) and the rest none; the same queue, counts and references as ``release`` testing each block.
    pools = [BlockPool(NUM_BLOCKS, enable_caching=True) for _ in range(2)]
    table: list[int] = []
    split = 0
    for pool in pools:  # (the same pool twice)
        rng = random.Random(seed)
        other: list[int] = []
        table = []
        pool.take(rng.randint(0, 6), other)  # (a table released before: blocks in the queue's two parts)
        pool.take(rng.randint(0, 12), table)
        split = rng.randint(0, len(table))
        keyed = table[:split]
        pool.cache([("content", block) for block in other[::2] + keyed], other[::2] + keyed)
        pool.release(other[::-1])
        for block in rng.sample(keyed, rng.randint(0, len(keyed))) if sharing else []:
            pool.reference(block)
    pools[0].release(table[::-1])
    pools[1].release_split([table[:split][::-1]], [table[split:][::-1]])
    assert pools[1].free_blocks.touched() == pools[0].free_blocks.touched()
    assert pools[1].ref_counts == pools[0].ref_counts
    assert pools[1].num_shared_references == pools[0].num_shared_references
    assert pools[1].num_frees == pools[0].num_frees
    assert len(pools[1].free_blocks) == len(pools[0].free_blocks)


class _TestingEveryBlock(KVBlockManager):
    """The manager whose releases test each block for a key (``BlockPool.release``): the reference."""

    def only_offered_blocks_keyed(self) -> bool:
        return False


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), block_size=st.sampled_from([1, 2, 4]))
def test_a_sequence_released_without_a_test_per_block_frees_as_one_testing_each(seed: int, block_size: int) -> None:
    # Prompts share documents (hits, shared blocks), are prefilled in chunks (blocks held but not yet offered to
    # the cache), decode and are released at any point; after every operation both managers hold the same
    # blocks, queue and cache. (The split applies where ``only_offered_blocks_keyed``: one full-attention group.)
    rng = random.Random(seed)
    num_blocks = rng.randint(8, 60)
    managers = [KVBlockManager(num_blocks, block_size, enable_prefix_caching=True),
                _TestingEveryBlock(num_blocks, block_size, enable_prefix_caching=True)]
    assert managers[0].only_offered_blocks_keyed()
    prompts = prompts_sharing_documents(rng)
    live: list[int] = []
    for step in range(40):
        sid = rng.randrange(len(prompts))
        length = rng.randint(1, 10 * block_size)
        computed = rng.randint(0, length)
        grow = rng.random() < 0.5
        for manager in managers:
            if sid not in live and manager.blocks_to_create(length, prompts[sid]) <= manager.num_free_blocks:
                manager.create_sequence(sid, length, block_hashes=prompts[sid], num_computed_tokens=computed)
            elif sid in live and grow and manager.sequences[sid].num_computed_tokens < \
                    manager.sequences[sid].sequence_length:
                manager.mark_computed(sid, manager.sequences[sid].sequence_length)
            elif sid in live and grow and manager.blocks_needed(sid, 1) <= manager.num_free_blocks:
                manager.grow(sid, 1)
            elif sid in live:
                manager.release_sequence(sid)
        if sid not in live and sid in managers[0].sequences:
            live.append(sid)
        elif sid in live and sid not in managers[0].sequences:
            live.remove(sid)
        fast, reference = (manager.pool for manager in managers)
        assert fast.free_blocks.touched() == reference.free_blocks.touched(), step
        assert fast.ref_counts == reference.ref_counts, step
        assert fast.keyed_cache() == reference.keyed_cache(), step
        assert (fast.num_frees, fast.num_shared_references) == (reference.num_frees, reference.num_shared_references)
        assert managers[0].invariant_violations() == [], step


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), num_tables=st.integers(1, 3))
def test_a_release_frees_in_one_pass_what_counting_each_block_down_frees(seed: int, num_tables: int) -> None:
    # ``BlockPool.unreference`` frees the blocks held once in one pass up to the first shared one, then counts the
    # rest down: against counting every block down, with the shared blocks anywhere (a hit's at the end of a
    # tail-first list, the usual case, or among the others) and held two or three times.
    rng = random.Random(seed)
    pool = BlockPool(NUM_BLOCKS)
    tables: list[list[int]] = [[] for _ in range(num_tables)]
    for table in tables:
        pool.take(rng.randint(0, 7), table)
    held = [block for table in tables for block in table]
    for block in rng.sample(held, rng.randint(0, len(held))) * rng.randint(1, 2):
        pool.reference(block)
    parts = [table[::-1] for table in tables]
    refs = list(pool.ref_counts)
    for block in held:
        refs[block] -= 1
    assert pool.unreference(parts) == [block for part in parts for block in part if refs[block] == 0]
    assert pool.ref_counts == refs
    assert pool.num_shared_references == sum(count - 1 for count in refs if count > 1)


def test_a_tables_shared_first_blocks_are_counted_down_and_the_others_freed() -> None:
    # Worked example: a table [0, 1, 2, 3] whose first two blocks a prompt hit (held twice), released tail first:
    # 3 and 2 are freed in the one pass, 1 and 0 counted down to 1 (held by the other table).
    pool = BlockPool(NUM_BLOCKS)
    table: list[int] = []
    pool.take(4, table)
    pool.reference(0, 1)
    assert pool.unreference([table[::-1]]) == [3, 2]
    assert pool.ref_counts[:4] == [1, 1, 0, 0] and pool.num_shared_references == 0
