"""``take_computed`` (a prefill's blocks taken, and cached at once where they are computed) against the take alone,
the caching left to the block manager's ``cache_full_blocks``: every sequence and the whole pool equal after each
call, keys private or not; and worked by hand, a new key that a taken block still carries (vLLM evicts all the
taken blocks' entries first, so the new block gets the entry)."""

from __future__ import annotations

import copy
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory import block_manager, hash_blocks
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.pool_loops import PRIVATE
from minipaged_cli.memory.sequence import OutOfBlocksError
from tests.memory.conftest import LOOP_KINDS

pytestmark = LOOP_KINDS  # (each test with the Python loops, then the compiled ones)


def pool_state(pool: BlockPool) -> tuple:
    return (pool.ref_counts, pool.block_hash, pool.cached_blocks, pool.duplicate_blocks, list(pool.free_blocks),
            pool.num_allocations, pool.num_evictions, pool.num_frees, pool.num_shared_references, pool.cache_version)


def test_a_new_key_a_taken_block_still_carries_goes_to_the_new_block() -> None:
    """Worked example: blocks 0 and 1 cached under "a" and "b" wait in the free queue, block 1 first; a take of both
    caches "b" in the first it takes. Evicting first drops both entries, then block 1 gets "b" again: no duplicate,
    block 0 keyless."""
    pool = BlockPool(2, enable_caching=True)
    table: list[int] = []
    pool.take(2, table)
    pool.cache_fresh(["a", "b"], table)
    pool.release(table[::-1])  # the back of the queue: block 1, then block 0
    new_table: list[int] = []
    pool.take(2, new_table)
    pool.cache_fresh(["b"], new_table[:1])
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
    shared_keys = set(hash_blocks(shared))
    live: list[int] = []
    for sequence_id in range(rng.randint(1, 25)):
        hashes = hash_blocks(shared[:rng.randint(0, 8)] + [("own", sequence_id, i) for i in range(rng.randint(0, 12))])
        if rng.random() < 0.5:  # (its own blocks' content no other sequence has: ``PRIVATE`` in their place)
            num_shared = sum(key in shared_keys for key in hashes)
            hashes = hashes[:num_shared] + [PRIVATE] * (len(hashes) - num_shared)
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
