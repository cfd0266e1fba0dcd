"""``pool_loops.take_into``, ``cache_into``, ``release_into`` and ``grow_batch``: ``BlockPool.take``,
``cache_fresh``, a sequence's ``release_split`` and a step's ``grow_together`` in one compiled call each where it is
the usual case, against the pool's own path in Python (the reference, which the Python loops always take). Two
managers with prefix caching, one on each, driven by the same random calls (prompts sharing documents, so hits take
cached blocks out of the free queue's back part, leave stale entries there and share blocks that a release counts
down; keys ``PRIVATE`` past a prompt's documents; chunked prefills, decodes, a step's growth of every live sequence
at once, releases that send keyless blocks to the front; two prompts computing the same content, a duplicate entry)
hold the same free queue, part by part, and the same counts, keys, map and duplicates after every call. A take by
hand through the queue's three parts; the cases left to the pool's own path."""

from __future__ import annotations

import collections
import copy
import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory import pool_loops
from minipaged_cli.memory.batched_growth import grow_computed
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.kv_groups import FULL_ATTENTION, SLIDING_ATTENTION, KVCacheGroup
from minipaged_cli.memory.pool_loops import PRIVATE
from minipaged_cli.memory.prefix import hash_blocks
from minipaged_cli.memory.sequence import SequenceState
from tests.memory.conftest import LOOP_KINDS, compiled, compiled_loops


def pool_state(pool: BlockPool) -> tuple:
    """Everything a take reads or writes: the free queue's parts as they lie (its back list with its passed and
    stale entries), the per-block lists, the map and its duplicates, the counts (a copy)."""
    queue = pool.free_blocks
    return copy.deepcopy((list(queue._front), queue.num_touched, queue._back[queue._head:], dict(queue._stale),
                          queue._num_stale, queue.num_free, pool.ref_counts, pool.block_hash, pool.block_group,
                          pool.keyed_cache(), pool.num_allocations, pool.num_evictions, pool.num_frees,
                          pool.cache_version, pool.num_shared_references))


def prompts(rng: random.Random) -> list[list]:
    """Eight prompts' block keys: up to 5 blocks of one of 3 shared documents, then 6 of the prompt's own, which
    half of them carry as ``PRIVATE`` (content no other prompt names)."""
    keyed = []
    for p, d in enumerate(rng.choices(range(3), k=8)):
        num_shared = rng.randint(0, 5)
        keys = hash_blocks([("doc", d, i) for i in range(num_shared)] + [("own", p, i) for i in range(6)])
        keyed.append(keys[:num_shared] + [PRIVATE] * 6 if rng.random() < 0.5 else keys)
    return keyed


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), block_size=st.sampled_from([1, 2, 4]))
def test_a_compiled_take_leaves_the_pool_as_its_own_path(seed: int, block_size: int) -> None:
    rng = random.Random(seed)
    num_blocks = rng.randint(6, 50)
    managers = [KVBlockManager(num_blocks, block_size, enable_prefix_caching=True) for _ in range(2)]
    managers[0].pool.loops = compiled_loops()
    managers[1].pool.loops = pool_loops.PYTHON
    keys = prompts(rng)
    for step in range(60):
        sid = rng.randrange(len(keys))
        length = rng.randint(1, 12 * block_size)
        computed = rng.randint(0, length)
        action, tokens = rng.random(), rng.randint(1, 3 * block_size)
        for manager in managers:
            state = manager.sequences.get(sid)
            if action > 0.85:  # a step's growth of every live sequence at once (``grow_batch``, compiled)
                grow_computed(manager, sorted(manager.sequences), tokens)
            elif state is None:
                if manager.blocks_to_create(length, keys[sid]) <= manager.num_free_blocks:
                    manager.create_sequence(sid, length, block_hashes=list(keys[sid]), num_computed_tokens=computed)
            elif action < 0.3 and state.num_computed_tokens < state.sequence_length:
                manager.mark_computed(sid, state.sequence_length)
            elif action < 0.7 and state.num_computed_tokens == state.sequence_length:
                if manager.blocks_needed(sid, tokens) <= manager.num_free_blocks:
                    manager.grow(sid, tokens)
            else:
                manager.release_sequence(sid)
        assert pool_state(managers[0].pool) == pool_state(managers[1].pool), step
        assert manager_state(managers[0]) == manager_state(managers[1]), step
        assert managers[0].invariant_violations() == [], step


def manager_state(manager: KVBlockManager) -> tuple:
    """Every live sequence's every field (``SequenceState``'s equality leaves its progress out), in the order
    listed, with those past their final length and the ids released (in their order)."""
    states = [(sid, type(state), dataclasses.astuple(state)) for sid, state in manager.sequences.items()]
    return states, sorted(manager.past_final), list(manager._released)


@LOOP_KINDS
def test_a_take_through_the_front_the_untouched_blocks_and_the_back_worked_by_hand() -> None:
    """Six blocks. Take 2 (never handed out: 0, 1), cache block 1 as "a", release both: 0, keyless, goes to the
    front, 1 to the back. A take of 5 gets 0 (front), 2, 3, 4, 5 (never handed out); one more gets 1 from the back
    and evicts "a". A hit on a cached free block leaves a stale entry, which the next take skips."""
    pool = BlockPool(6, enable_caching=True)
    first: list[int] = []
    pool.take(2, first)
    pool.cache(["a"], [1])
    pool.release(first)
    assert list(pool.free_blocks._front) == [0] and pool.free_blocks._back == [1]
    table: list[int] = []
    pool.take(5, table)
    assert table == [0, 2, 3, 4, 5] and pool.num_evictions == 0 and pool.cached_blocks[0] == {"a": 1}
    pool.take(1, table)
    assert table == [0, 2, 3, 4, 5, 1] and pool.num_evictions == 1 and pool.cached_blocks[0] == {}
    assert pool.ref_counts == [1] * 6 and pool.block_hash == [None] * 6 and pool.num_allocations == 8
    # Cache 2 and 3, free them (to the back, in order), revive 2 by a hit: its entry in the back list is stale
    pool.cache(["b", "c"], [2, 3])
    pool.release([2, 3])
    pool.reference(2)
    assert pool.free_blocks._stale == {2: 1} and len(pool.free_blocks) == 1
    last: list[int] = []
    pool.take(1, last)
    assert last == [3] and pool.free_blocks._stale == {} and pool.cached_blocks[0] == {"b": 2}
    assert len(pool.free_blocks) == 0 and pool.num_evictions == 2


def test_the_compiled_calls_leave_the_unusual_cases_to_the_pool() -> None:
    """Several groups, a subscriber to the pool's events, a duplicate entry, no block to take or more than are
    free: the compiled take answers False and changes nothing; nor does the compiled caching under several groups,
    a subscriber, a key log or another group than the first."""
    take_into, cache_into = compiled_loops().take_into, compiled_loops().cache_into

    class Listener:
        def cached(self, keys: object, blocks: object) -> None: ...

        def evicted(self, keys: object, blocks: object) -> None: ...

    pools = [BlockPool(4, num_groups=2, enable_caching=True), BlockPool(4, enable_caching=True),
             BlockPool(4, enable_caching=True), BlockPool(4, enable_caching=True)]
    pools[1].events.subscribe(Listener())
    pools[2].duplicate_blocks[0]["k"] = [3]
    for pool, count in [*((pool, 1) for pool in pools[:3]), (pools[3], 0), (pools[3], 5)]:
        before = pool_state(pool)
        table: list[int] = []
        assert take_into(pool, count, table) is False
        assert table == [] and pool_state(pool) == before
    logged = BlockPool(4, enable_caching=True)
    logged.events.log_keys()
    for pool, group in [(pools[0], 0), (pools[0], 1), (pools[1], 0), (logged, 0)]:
        table = []
        pool.take(2, table)
        before = pool_state(pool)
        assert cache_into(pool, ["x", "y"], table, group) is False
        assert pool_state(pool) == before
    groups = [KVCacheGroup(FULL_ATTENTION, (0,), 1)]
    manager = KVBlockManager(4, 1, groups, enable_prefix_caching=True)
    manager.pool.loops = compiled_loops()
    manager.create_sequence(0, 3)  # (the usual case: taken by the compiled call)
    assert manager.sequences[0].block_table == [0, 1, 2] and manager.pool.num_allocations == 3


def test_a_compiled_growth_leaves_a_key_met_to_the_one_at_a_time_path() -> None:
    """Blocks of 2 tokens, sequences of 1 token each. Two that fill their first block with the same key "k" in one
    step, or one whose key "z" has an entry: ``grow_batch`` answers None (``grow_together``'s answer: the one at a
    time path runs) and changes nothing. Two filling ``PRIVATE`` meet no key: they grow, and their blocks are
    cached without an entry."""
    grow_batch = compiled_loops().grow_batch
    manager = KVBlockManager(10, 2, enable_prefix_caching=True)
    manager.pool.loops = compiled_loops()
    manager.create_sequence(0, 1, block_hashes=["k", "m"], final_length=4)
    manager.create_sequence(1, 1, block_hashes=["k", "n"], final_length=4)
    manager.create_sequence(2, 2, block_hashes=["z"], final_length=4)  # ("z" full and computed: an entry)
    manager.create_sequence(3, 1, block_hashes=["z"], final_length=4)
    manager.create_sequence(4, 1, block_hashes=[PRIVATE], final_length=4)
    manager.create_sequence(5, 1, block_hashes=[PRIVATE], final_length=4)
    assert manager.pool.cached_blocks[0] == {"z": 2}
    for ids in ([0, 1], [3], [4, 3]):
        before, pool_before = manager_state(manager), pool_state(manager.pool)
        assert grow_batch(manager, ids, 1) is None
        assert manager_state(manager) == before and pool_state(manager.pool) == pool_before
    assert grow_batch(manager, [0], 1) == 1 and manager.pool.cached_blocks[0] == {"z": 2, "k": 0}
    assert grow_batch(manager, [4, 5], 1) == 2
    assert [manager.sequences[i].num_cached_blocks for i in (4, 5)] == [[1], [1]]
    assert manager.pool.block_hash[4:6] == [PRIVATE, PRIVATE] and manager.pool.cached_blocks[0] == {"z": 2, "k": 0}
    # Keys in a list of another kind than the manager makes: False (its Python path), nothing changed
    manager.sequences[1].block_hashes = collections.UserList(["q", "n"])
    before, pool_before = manager_state(manager), pool_state(manager.pool)
    assert grow_batch(manager, [5, 1], 1) is False
    assert manager_state(manager) == before and pool_state(manager.pool) == pool_before


def test_a_compiled_release_is_release_sequence_worked_by_hand() -> None:
    """Blocks of 2 tokens, keeping 2 released ids: four sequences released in turn, one of them re-created and
    released again. Each release frees its table (block 0's key to the back, the keyless to the front), takes the
    sequence off the list past its final length, and makes its id the latest released, the oldest forgotten past 2.
    An unknown id, one released, a fork, a window or two groups: False and nothing changed (the Python path raises
    or releases)."""
    release = compiled_loops().release_sequence_into
    manager = KVBlockManager(10, 2, enable_prefix_caching=True)
    for sequence_id in range(4):
        manager.create_sequence(sequence_id, 3, block_hashes=[("k", sequence_id)], final_length=3)
    assert sorted(manager.past_final) == [0, 1, 2, 3]  # (2 blocks of 2 slots for 3 tokens)
    assert release(manager, 0, 2) is True
    assert manager.pool.free_blocks._back == [0] and list(manager.pool.free_blocks._front)[:1] == [1]
    assert 0 not in manager.sequences and 0 not in manager.past_final and list(manager._released) == [0]
    assert release(manager, 1, 2) and release(manager, 2, 2)
    assert list(manager._released) == [1, 2] and manager.pool.ref_counts[:6] == [0] * 6
    manager.create_sequence(1, 1)
    assert release(manager, 1, 2) and list(manager._released) == [2, 1]
    for unusual in (7, 2):  # (unknown; released)
        before, pool_before = manager_state(manager), pool_state(manager.pool)
        assert release(manager, unusual, 2) is False
        assert manager_state(manager) == before and pool_state(manager.pool) == pool_before
    manager.fork(3, 8)
    windowed = KVBlockManager(10, 2, [KVCacheGroup(SLIDING_ATTENTION, (0,), 1, 4)])
    two_groups = KVBlockManager(10, 2, [KVCacheGroup(FULL_ATTENTION, (g,), 1) for g in range(2)])
    for other in (windowed, two_groups):
        other.create_sequence(0, 3)
    for unusual_manager, sequence_id in ((manager, 3), (windowed, 0), (two_groups, 0)):
        before, pool_before = manager_state(unusual_manager), pool_state(unusual_manager.pool)
        assert release(unusual_manager, sequence_id, 2) is False
        assert manager_state(unusual_manager) == before and pool_state(unusual_manager.pool) == pool_before


def test_a_compiled_creation_is_create_sequence_worked_by_hand() -> None:
    """Blocks of 2 tokens, a prompt of 7 (4 blocks) with 5 tokens computed and 3 keys, at most 7 tokens long: the
    state as ``create_sequence`` makes it (2 blocks cached, listed past its final length), its own list of keys;
    then a prompt that hits two of them."""
    manager = KVBlockManager(10, 2, enable_prefix_caching=True)
    manager.pool.loops = compiled_loops()
    keys = ["a", "b", "c"]
    state = manager.pool.loops.create_into(manager, 5, 7, keys, 5, 7, None)
    assert manager.sequences == {5: state} and state.block_hashes is keys
    assert dataclasses.astuple(state) == (5, 7, [[0, 1, 2, 3]], keys, 0, 5, [0], [2], 0, 4, 7)
    assert manager.pool.cached_blocks[0] == {"a": 0, "b": 1} and manager.past_final == {5: state}
    assert manager.pool.ref_counts == [1, 1, 1, 1] and manager.pool.num_allocations == 4  # (blocks never taken: none)
    # A prompt of 6 tokens whose first 2 blocks are "a" and "b": they are its hits, held twice now; 1 block taken
    hits, hit_tokens = manager.find_hits(["a", "b", "x"], 6)
    assert (hits, hit_tokens) == ([[0, 1]], 4)
    other = manager.pool.loops.create_into(manager, 6, 6, ["a", "b", "x"], 6, None, hits[0])
    assert dataclasses.astuple(other) == (6, 6, [[0, 1, 4]], ["a", "b", "x"], 4, 6, [0], [3], 0, 3, None)
    assert manager.pool.ref_counts == [2, 2, 1, 1, 1] and manager.pool.num_shared_references == 2
    assert manager.pool.cached_blocks[0] == {"a": 0, "b": 1, "x": 4} and 6 not in manager.past_final


def test_a_compiled_creation_leaves_the_unusual_cases_to_create_sequence() -> None:
    """A hit (its first key cached), a fork, a sliding window, keys in a tuple, a listed id, too few free blocks, a
    duplicate entry, a subscriber: False, and nothing changed."""
    def fresh(**options: object) -> KVBlockManager:
        manager = KVBlockManager(8, 2, enable_prefix_caching=True, **options)
        manager.pool.loops = compiled_loops()
        manager.create_sequence(0, 4, block_hashes=["a", "b"])  # (cached: "a" is a hit for a later prompt)
        return manager

    cases = {"hit": (fresh(), (1, 5, ["a", "x"], 5, None)), "listed": (fresh(), (0, 2, [], 2, None)),
             "too few blocks": (fresh(), (1, 13, ["x"], 13, None)), "tuple": (fresh(), (1, 4, ("x",), 4, None))}
    forked, duplicated, subscribed = fresh(), fresh(), fresh()
    forked.fork(0, 9)
    duplicated.pool.duplicate_blocks[0]["k"] = [3]
    subscribed.pool.events.subscribe(object())
    sliding = KVBlockManager(8, 2, [KVCacheGroup(FULL_ATTENTION, (0,), 1), KVCacheGroup("sliding_window", (1,), 1,
                                                                                          sliding_window=4)])
    sliding.pool.loops = compiled_loops()
    cases |= {name: (manager, (1, 4, ["x"], 4, None)) for name, manager in
              [("fork", forked), ("duplicate entry", duplicated), ("subscriber", subscribed), ("window", sliding)]}
    for name, (manager, args) in cases.items():
        before = (pool_state(manager.pool), manager_state(manager))
        assert manager.pool.loops.create_into(manager, *args, None) is False, name
        assert (pool_state(manager.pool), manager_state(manager)) == before, name


def test_the_compiled_creation_binds_no_state_with_a_slot_it_would_leave_unset() -> None:
    """``create_into`` makes a state without its ``__init__``, setting the 11 slots it knows: a state class of
    another number is refused when it is bound, before anything is bound to it."""
    fields = [(field.name, field.type, field) for field in dataclasses.fields(SequenceState)]
    wider = dataclasses.make_dataclass("Wider", [*fields, ("extra", int, dataclasses.field(default=0))], slots=True)
    with pytest.raises(TypeError, match="12 slots where create_into's new_state sets 11"):
        compiled()[0].bind_sequence_state(wider)  # (the built module, as under MINIPAGED_NATIVE=0 too)
    manager = KVBlockManager(4, 1, enable_prefix_caching=True)
    manager.pool.loops = compiled_loops()
    assert type(manager.pool.loops.create_into(manager, 0, 2, [], 2, None, None)) is SequenceState  # (still bound)
