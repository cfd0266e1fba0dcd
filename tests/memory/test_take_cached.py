"""``take_cached`` (a prefill's blocks taken and cached in one pass) against ``BlockPool.take`` then
``BlockPool.cache_fresh`` over the same blocks: the same table, reference counts, cache entries, duplicates, free
queue and counters, including where a new key is one a taken block still carries (vLLM evicts all the taken
blocks' entries first, so the new block gets the entry) and where it is cached by a block that stays; and the same
keys logged for a replica's KV events as those two calls tell a subscriber."""

from __future__ import annotations

import copy
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory import block_manager, hash_blocks
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.pool_loops import PRIVATE
from minipaged_cli.memory.sequence import OutOfBlocksError
from minipaged_cli.memory.take_cached import take_cached
from tests.memory.conftest import LOOP_KINDS
from tests.memory.test_pool_events import Logged

pytestmark = LOOP_KINDS  # (each test with the Python loops, then the compiled ones)


def pool_state(pool: BlockPool) -> tuple:
    return (pool.ref_counts, pool.block_hash, pool.cached_blocks, pool.duplicate_blocks, list(pool.free_blocks),
            pool.num_allocations, pool.num_evictions, pool.num_frees, pool.num_shared_references, pool.cache_version)


def random_pool(rng: random.Random) -> tuple[BlockPool, list[int], int]:
    """A pool whose free queue holds cached blocks (keys from a small alphabet, each cached once, or ``PRIVATE``)
    and uncached ones, other tables holding cached blocks, and a table to take onto: its offered blocks, then held
    ones with no key (a prompt's partly filled last block); the table and how many of it are offered."""
    pool = BlockPool(rng.randint(8, 40), enable_caching=True)
    keys: list = [PRIVATE if rng.random() < 0.2 else key for key in rng.sample(range(30), 30)]  # (no entry)
    for _ in range(rng.randint(0, 5)):
        table: list[int] = []
        count = rng.randint(1, 6)
        if count > pool.free_blocks.num_free:
            break
        pool.take(count, table)
        cached = [block for block in table if rng.random() < 0.7 and keys]
        pool.cache_fresh([keys.pop() for _ in cached], cached)
        if rng.random() < 0.7:  # released: its cached blocks wait at the back, the others at the front
            pool.release(table[::-1])
    table = []
    offered = rng.randint(0, 3)
    held = rng.randint(0, 2)
    if offered + held <= pool.free_blocks.num_free:
        pool.take(offered + held, table)
        pool.cache_fresh([keys.pop() for _ in range(offered)], table[:offered])
    else:
        offered = 0
    return pool, table, offered


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_take_cached_leaves_the_pool_as_take_then_cache_fresh(seed: int) -> None:
    rng = random.Random(seed)
    pool, table, offered = random_pool(rng)
    if not pool.free_blocks.num_free:
        return
    count = rng.randint(1, pool.free_blocks.num_free)
    # the keys of the held blocks past those offered and of some new ones: old keys of the pool (a taken block's,
    # a block that stays cached), repeats among themselves, fresh ones
    num_keys = rng.randint(len(table) - offered + 1, len(table) - offered + count)
    new_keys = [rng.choice([rng.randrange(30), rng.randrange(100, 104), 200 + i, PRIVATE]) for i in range(num_keys)]
    expected, expected_table = copy.deepcopy((pool, table))
    told: list[tuple] = []
    expected.events.subscribe(Logged("told", told))
    log = pool.events.log_keys()
    expected.take(count, expected_table)
    expected.cache_fresh(new_keys, expected_table[offered:offered + num_keys])
    take_cached(pool, count, table, new_keys, offered)
    assert table == expected_table
    assert pool_state(pool) == pool_state(expected)
    # (its key log gains the keys the two calls tell a subscriber, as many times each)
    for name, logged in (("cached", log.stored), ("evicted", log.removed)):
        assert Counter(logged) == Counter(key for _, kind, keys, _ in told if kind == name for key in keys)


def test_a_new_key_a_taken_block_still_carries_goes_to_the_new_block() -> None:
    """Worked example: blocks 0 and 1 cached under "a" and "b" wait in the free queue; a take of both caches "b"
    in block 0. Evicting first drops both entries, then block 0 gets "b": no duplicate, block 1 keyless."""
    pool = BlockPool(2, enable_caching=True)
    table: list[int] = []
    pool.take(2, table)
    pool.cache_fresh(["a", "b"], table)
    pool.release(table[::-1])  # the back of the queue: block 1, then block 0
    new_table: list[int] = []
    take_cached(pool, 2, new_table, ["b"], 0)
    assert new_table == [1, 0]
    assert pool.cached_blocks[0] == {"b": 1} and pool.duplicate_blocks[0] == {}
    assert pool.block_hash == [None, "b"] and pool.ref_counts == [1, 1] and pool.num_evictions == 2


def reference_take(manager: KVBlockManager, state, count: int, num_computed: int) -> None:
    """The readable path: the take alone, the caching left to ``_computed``'s ``cache_full_blocks``."""
    manager.pool.take(count, state.block_tables[0])


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_a_prefix_cached_replay_takes_and_caches_as_the_readable_path(seed: int) -> None:
    """Prompts admitted in chunks, grown, released, sharing prefixes, against the same calls with the take and the
    caching apart: every sequence and the whole pool equal after each call."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    managers = [KVBlockManager(rng.randint(8, 40), block_size, enable_prefix_caching=True) for _ in range(2)]
    managers[1] = copy.deepcopy(managers[0])
    shared = [("shared", i) for i in range(8)]
    live: list[int] = []
    for sequence_id in range(rng.randint(1, 25)):
        hashes = hash_blocks(shared[:rng.randint(0, 8)] + [("own", sequence_id, i) for i in range(rng.randint(0, 12))])
        call = rng.random()
        if call < 0.4 or not live:
            prompt = rng.randint(1, 8 * block_size)
            computed = rng.randint(0, prompt)
            action = ("create", sequence_id, prompt, hashes, computed)
        elif call < 0.8:
            action = ("grow", rng.choice(live), rng.randint(1, 3 * block_size), rng.random() < 0.8)
        else:
            action = ("release", live.pop(rng.randrange(len(live))))
        results = []
        for manager, fast in zip(managers, (True, False), strict=True):
            original = block_manager.take_computed
            if not fast:
                block_manager.take_computed = reference_take
            try:
                results.append(run(manager, action))
            finally:
                block_manager.take_computed = original
        assert results[0] == results[1]
        if action[0] == "create" and results[0] == "ok":
            live.append(sequence_id)
        fast, readable = managers
        assert fast.sequences == readable.sequences
        assert [(s.num_computed_tokens, s.num_cached_blocks, s.num_held_blocks) for s in fast.sequences.values()] == \
            [(s.num_computed_tokens, s.num_cached_blocks, s.num_held_blocks) for s in readable.sequences.values()]
        assert pool_state(fast.pool) == pool_state(readable.pool)
        assert fast.invariants_ok(), fast.invariant_violations()


def run(manager: KVBlockManager, action: tuple) -> str:
    try:
        if action[0] == "create":
            _, sequence_id, prompt, hashes, computed = action
            manager.create_sequence(sequence_id, prompt, block_hashes=hashes, num_computed_tokens=computed)
        elif action[0] == "grow":
            _, sequence_id, num_tokens, computed = action
            manager.grow(sequence_id, num_tokens, computed=computed)
        else:
            manager.release_sequence(action[1])
    except OutOfBlocksError:
        return "out of blocks"
    return "ok"
