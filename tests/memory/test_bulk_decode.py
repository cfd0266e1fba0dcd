"""``bulk.decode_in_bulk`` (the replay's fast path for decode steps under KV cache groups) against
the steps one at a time: every running sequence grows by one token a step, in the running order, as the
single-step replay grows them. The pool must end exactly as they leave it: the same free queue in the same order,
the same block tables, cache map, per-block hashes and reference counts, the same counters; where the fast path
declines it must change nothing."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from minipaged_cli.memory import hash_blocks
from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.bulk import decode_in_bulk
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.memory.paged import PagedAllocator
from minipaged_cli.workloads.presets import FULL_ATTENTION, SLIDING_ATTENTION
from tests.memory.conftest import LOOP_KINDS

pytestmark = LOOP_KINDS  # (each test with the Python loops, then the compiled ones)

LAYOUTS = ((SLIDING_ATTENTION, FULL_ATTENTION), (SLIDING_ATTENTION, SLIDING_ATTENTION, FULL_ATTENTION),
           (FULL_ATTENTION, SLIDING_ATTENTION))


def state(manager: KVBlockManager) -> tuple:
    pool = manager.pool
    return (list(pool.free_blocks), pool.free_blocks.touched(), copy.deepcopy(manager.sequences),
            copy.deepcopy(pool.cached_blocks), copy.deepcopy(pool.duplicate_blocks), list(pool.block_hash),
            [group for group, key in zip(pool.block_group, pool.block_hash, strict=True) if key is not None],
            list(pool.ref_counts), pool.num_evictions, pool.num_allocations, pool.num_frees,
            pool.num_shared_references)


def scenario(seed: int) -> tuple[KVBlockManager, list[int], int]:
    """A manager with running sequences (some sharing a cached prefix), cached blocks freed by finished ones in
    its free queue, and a number of decode steps to take."""
    rng = random.Random(seed)
    block_size, window = rng.choice([1, 2, 4, 16]), rng.randint(1, 40)
    groups = [KVCacheGroup(kind, (i,), 1, window if kind == SLIDING_ATTENTION else None)
              for i, kind in enumerate(rng.choice(LAYOUTS))]
    manager = KVBlockManager(rng.randint(60, 400), block_size, groups, enable_prefix_caching=True)
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
    if decode_in_bulk(bulk, running, num_steps):
        assert state(bulk) == state(single)
    else:
        assert state(bulk) == before


def test_the_scenarios_take_the_fast_path_and_free_blocks_in_it() -> None:
    """The comparison above is not vacuous: most scenarios run the fast path, and windows free blocks in it."""
    taken = frees = 0
    for seed in range(60):
        manager, running, num_steps = scenario(seed)
        num_frees = manager.pool.num_frees
        if decode_in_bulk(manager, running, num_steps):
            taken += 1
            frees += manager.pool.num_frees > num_frees
    assert taken >= 40 and frees >= 20


def test_decode_in_bulk_declines_without_prefix_caching() -> None:
    """Without prefix caching a freed block goes to the front of the queue, where a later step of the same advance
    would take it: the fast path must decline and change nothing (the caller then steps in lockstep)."""
    groups = [KVCacheGroup(SLIDING_ATTENTION, (0,), 1, 8), KVCacheGroup(FULL_ATTENTION, (1,), 1, None)]
    manager = KVBlockManager(200, 4, groups)
    for sid in range(3):
        manager.create_sequence(sid, 10 + sid)
    before = state(manager)
    assert not decode_in_bulk(manager, [0, 1, 2], 12)
    assert state(manager) == before


def test_the_checker_names_groups_that_slid_or_cached_alone() -> None:
    """The fast paths count one sliding group's null entries and one group's cached blocks for all of a
    sequence's groups; a manager where they differ is broken, and the checker must say so (planted: one group
    moved alone)."""
    groups = [KVCacheGroup(SLIDING_ATTENTION, (0,), 1, 8), KVCacheGroup(SLIDING_ATTENTION, (1,), 1, 8),
              KVCacheGroup(FULL_ATTENTION, (2,), 1, None)]
    manager = KVBlockManager(200, 4, groups, enable_prefix_caching=True)
    manager.create_sequence(0, 30, block_hashes=hash_blocks(("own", i) for i in range(10)))
    manager.grow(0, 1)
    assert manager.invariant_violations() == []
    sequence = manager.sequences[0]
    assert sequence.num_null == [5, 5, 0] and sequence.num_cached_blocks == [7, 7, 7]
    sequence.num_cached_blocks[2] = 6
    assert any("a group cached alone" in problem for problem in manager.invariant_violations())
    sequence.num_cached_blocks[2] = 7
    manager.pool.release([sequence.block_tables[1][5]])  # group 1's window lets go of one more block alone
    sequence.block_tables[1][5] = -1
    sequence.num_null[1] = 6
    assert any("a window slid in one group alone" in problem for problem in manager.invariant_violations())


def test_the_checker_names_a_stale_held_count_and_a_key_past_the_cached_blocks() -> None:
    """The accounting reads a sequence's held blocks as a count, and caching takes every entry past the cached
    ones for keyless: the checker recounts both from the tables (planted: a count one off, a key one block too
    far)."""
    groups = [KVCacheGroup(SLIDING_ATTENTION, (0,), 1, 8), KVCacheGroup(FULL_ATTENTION, (1,), 1, None)]
    manager = KVBlockManager(200, 4, groups, enable_prefix_caching=True)
    manager.create_sequence(0, 30, block_hashes=hash_blocks(("own", i) for i in range(10)))
    manager.grow(0, 11)  # 41 tokens, 11 entries a group; slid with 30 computed: (30 - 8 + 1) // 4 = 5 null
    sequence = manager.sequences[0]
    assert manager.invariant_violations() == []
    assert sequence.num_held_blocks == 11 + 11 - 5 and sequence.num_cached_blocks == [10, 10]
    sequence.num_held_blocks += 1
    assert any("a table changed without its count" in problem for problem in manager.invariant_violations())
    sequence.num_held_blocks -= 1
    sequence.num_cached_blocks[:] = [9, 9]  # block 9's key now lies past the blocks offered to the cache
    assert any("cached twice, or a stale count" in problem for problem in manager.invariant_violations())


@pytest.mark.parametrize("seed", range(40))
def test_bulk_profile_against_a_count_per_request_and_step(seed: int) -> None:
    """``PagedAllocator.bulk_profile`` (numpy over requests and steps) against the counts written per request
    and step from the rules: during step j a request of length L + j holds ceil((L + j) / B) entries in each
    group, max(0, L + j - W) // B of them null in a sliding group; the advance is safe while each step's new
    entries fit on what the earlier steps left free."""
    rng = random.Random(seed)
    block_size, window = rng.choice([1, 4, 16]), rng.randint(1, 60)
    kinds = rng.choice(LAYOUTS)
    groups = [KVCacheGroup(kind, (i,), 1, window if kind == SLIDING_ATTENTION else None)
              for i, kind in enumerate(kinds)]
    num_groups, num_sliding = len(groups), kinds.count(SLIDING_ATTENTION)
    allocator = PagedAllocator(rng.randint(40, 400), block_size, groups, prefix_caching=False,
                               max_in_flight_tokens=64, max_model_len=4096)
    holdings, lengths, finals = [], [], []
    for sid in range(rng.randint(1, 8)):
        prompt = rng.randint(1, 5 * block_size + window)
        holding = Holding(sid, prompt, rng.randint(1, 80))
        if allocator.manager.blocks_to_create(prompt) > allocator.manager.num_free_blocks:
            break
        allocator.admit(holding, prompt)
        allocator.manager.grow(sid, 0)  # the slide a finished prefill leaves for the first decode step
        holdings.append(holding)
        lengths.append(prompt)
        finals.append(holding.final_length)
    if not holdings:
        pytest.skip("no prompt fits")
    num_steps = rng.randint(1, 3 * block_size + 10)
    allocated = [allocator.allocated(holding) for holding in holdings]
    free = allocator.manager.num_free_blocks
    held = []  # per step (0: now) [entries, blocks held, token slots, slots past the final lengths]
    for step in range(num_steps + 1):
        entries = [-(-(length + step) // block_size) for length in lengths]
        nulls = [max(0, length + step - window) // block_size for length in lengths]
        held.append((sum(entries),
                     sum(num_groups * e - num_sliding * z for e, z in zip(entries, nulls, strict=True)),
                     sum(num_groups * (length + step) - num_sliding * block_size * z
                         for length, z in zip(lengths, nulls, strict=True)),
                     sum(num_groups * max(e * block_size - final, 0)
                         for e, final in zip(entries, finals, strict=True))))
    held[0] = (held[0][0], sum(allocated) // block_size, *held[0][2:])
    num_ok = 0
    while num_ok < num_steps and (held[num_ok][1] - held[0][1]) + num_groups * (held[num_ok + 1][0]
                                                                               - held[num_ok][0]) <= free:
        num_ok += 1
    profile = allocator.bulk_profile(np.array(lengths, dtype=np.int64), np.array(allocated, dtype=np.int64),
                                     np.array(finals, dtype=np.int64), num_steps)
    assert profile.num_steps == num_ok
    assert list(profile.allocated) == [held[j][1] * block_size for j in range(1, num_ok + 1)]
    assert list(profile.tokens) == [held[j][2] for j in range(1, num_ok + 1)]
    assert list(profile.internal) == [held[j][3] for j in range(1, num_ok + 1)]
