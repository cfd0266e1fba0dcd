"""``HybridBlockManager.decode_in_bulk`` (the replay's fast path for decode steps under KV cache groups) against
the steps one at a time: every running sequence grows by one token a step, in the running order, as the
single-step replay grows them. The pool must end exactly as they leave it: the same free queue in the same order,
the same block tables, cache map, per-block hashes and reference counts, the same counters; where the fast path
declines it must change nothing."""

from __future__ import annotations

import copy
import random

import pytest

from minipaged_cli.memory import hash_blocks
from minipaged_cli.memory.hybrid import HybridBlockManager
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.workloads.presets import FULL_ATTENTION, SLIDING_ATTENTION

LAYOUTS = ((SLIDING_ATTENTION, FULL_ATTENTION), (SLIDING_ATTENTION, SLIDING_ATTENTION, FULL_ATTENTION),
           (FULL_ATTENTION, SLIDING_ATTENTION))


def state(manager: HybridBlockManager) -> tuple:
    pool = manager.pool
    return (list(pool.free_blocks), pool.free_blocks.touched(), copy.deepcopy(manager.sequences),
            dict(pool.cached_blocks), copy.deepcopy(pool.duplicate_blocks), list(pool.block_hash),
            list(pool.ref_counts), pool.num_evictions, pool.num_allocations, pool.num_frees,
            pool.num_shared_references)


def scenario(seed: int) -> tuple[HybridBlockManager, list[int], int]:
    """A manager with running sequences (some sharing a cached prefix), cached blocks freed by finished ones in
    its free queue, and a number of decode steps to take."""
    rng = random.Random(seed)
    block_size, window = rng.choice([1, 2, 4, 16]), rng.randint(1, 40)
    groups = [KVCacheGroup(kind, (i,), 1, window if kind == SLIDING_ATTENTION else None)
              for i, kind in enumerate(rng.choice(LAYOUTS))]
    manager = HybridBlockManager(rng.randint(60, 400), block_size, groups, enable_prefix_caching=True)
    shared = [("shared", i) for i in range(rng.randint(0, 12))]
    running = []
    for sid in range(rng.randint(2, 9)):
        hashes = hash_blocks(shared[:rng.randint(0, len(shared))] + [("own", sid, i) for i in range(200)])
        prompt = rng.randint(1, 6 * block_size + window)
        if manager.blocks_to_create(prompt, hashes) + 4 * len(groups) > manager.num_free_blocks:
            break
        manager.create_sequence(sid, prompt, block_hashes=hashes)
        for _ in range(rng.randint(0, 3)):  # some decode steps already taken one at a time
            manager.grow(sid, 1)
        running.append(sid)
    for sid in rng.sample(running, len(running) // 3):  # finished: their cached blocks wait in the free queue
        manager.release_sequence(sid)
        running.remove(sid)
    return manager, running, rng.randint(1, 3 * block_size + 5)


@pytest.mark.parametrize("seed", range(60))
def test_decode_in_bulk_leaves_the_pool_as_single_steps(seed: int) -> None:
    bulk, running, num_steps = scenario(seed)
    single = copy.deepcopy(bulk)
    before = state(bulk)
    for _ in range(num_steps):
        for sid in running:
            if single.blocks_needed(sid, 1) > single.num_free_blocks:
                pytest.skip("the pool runs out: the replay would stop before this step")
            single.grow(sid, 1)
    if bulk.decode_in_bulk(running, num_steps):
        assert state(bulk) == state(single)
    else:
        assert state(bulk) == before


def test_the_scenarios_take_the_fast_path_and_free_blocks_in_it() -> None:
    """The comparison above is not vacuous: most scenarios run the fast path, and windows free blocks in it."""
    taken = frees = 0
    for seed in range(60):
        manager, running, num_steps = scenario(seed)
        num_frees = manager.pool.num_frees
        if manager.decode_in_bulk(running, num_steps):
            taken += 1
            frees += manager.pool.num_frees > num_frees
    assert taken >= 40 and frees >= 20
