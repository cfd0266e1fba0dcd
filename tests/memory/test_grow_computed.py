"""``bulk.grow_computed`` (a run of sequences grown in one call, lengths moved without ``grow`` where nothing else
changes) against ``KVBlockManager.grow`` called for each sequence in order: the same blocks taken, copied, cached
and evicted in the same order, the same sequence that first cannot grow, and the rest untouched."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory import hash_blocks, pool_loops
from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.batched_growth import grow_computed
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.memory.sequence import OutOfBlocksError
from minipaged_cli.workloads.presets import FULL_ATTENTION, SLIDING_ATTENTION
from tests.memory.conftest import LOOP_KINDS, compiled
from tests.memory.test_bulk_decode import state

pytestmark = LOOP_KINDS  # (each test with the Python loops, then the compiled ones)


@dataclass(eq=False, slots=True)
class Held(Holding):
    """A holding of a kind of its own (as the scheduler's requests are): its id in the slot its base class declares."""

    note: int = 0


def named(rng: random.Random, sequence_ids: list[int]) -> list[int | Holding]:
    """Each sequence by its id, or by a holding allocated under it."""
    return [rng.choice([sequence_id, Holding(sequence_id, 1, 1), Held(sequence_id, 1, 1)]) for sequence_id in
            sequence_ids]


def progress(manager: KVBlockManager) -> dict:
    """Each sequence's fields that its state's equality leaves out (progress, not identity)."""
    return {sequence_id: (s.num_computed_tokens, s.num_null, s.num_cached_blocks, s.num_loading_tokens,
                          s.num_held_blocks) for sequence_id, s in manager.sequences.items()}


def grown_one_by_one(manager: KVBlockManager, sequence_ids: list[int], num_tokens: int) -> int:
    """The reference: ``grow`` each in order until one cannot."""
    for done, sequence_id in enumerate(sequence_ids):
        try:
            manager.grow(sequence_id, num_tokens)
        except OutOfBlocksError:
            return done
    return len(sequence_ids)


def random_manager(rng: random.Random) -> tuple[KVBlockManager, list[int]]:
    """A small pool with sequences in every state a running one can be in: decoding, some sharing a cached prefix,
    some forked (a shared, partly filled last block), one reserved whole with part of it computed, one loading."""
    block_size = rng.choice([1, 2, 4])
    layout = rng.choice([(FULL_ATTENTION,), (FULL_ATTENTION, FULL_ATTENTION), (SLIDING_ATTENTION, FULL_ATTENTION)])
    groups = [KVCacheGroup(kind, (i,), 1, 6 if kind == SLIDING_ATTENTION else None) for i, kind in enumerate(layout)]
    manager = KVBlockManager(rng.randint(12, 60), block_size, groups, enable_prefix_caching=rng.random() < 0.8)
    shared = [("shared", i) for i in range(6)]
    running: list[int] = []
    for sequence_id in range(rng.randint(1, 8)):
        hashes = hash_blocks(shared[:rng.randint(0, 6)] + [("own", sequence_id, i) for i in range(rng.randint(0, 40))])
        prompt = rng.randint(1, 5 * block_size + 2)
        computed = rng.choice([prompt, prompt, rng.randint(0, prompt)])  # some reserved whole, not all computed
        if manager.blocks_to_create(prompt, hashes) + 2 > manager.num_free_blocks:
            break
        live = manager.create_sequence(sequence_id, prompt, block_hashes=hashes, num_computed_tokens=computed)
        if rng.random() < 0.2 and live.num_computed_tokens < live.sequence_length:
            live.num_loading_tokens = live.sequence_length - live.num_computed_tokens  # a tier loads the rest
        running.append(sequence_id)
        if len(groups) == 1 and computed == prompt and rng.random() < 0.4:  # a forked sample
            manager.fork(sequence_id, 100 + sequence_id)
            running.append(100 + sequence_id)
    for sequence_id in rng.sample(running, len(running) // 4):  # finished: cached blocks wait in the free queue
        manager.release_sequence(sequence_id)
        running.remove(sequence_id)
    rng.shuffle(running)
    return manager, running


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 1_000_000), rounds=st.integers(1, 12))
def test_grow_computed_equals_grow_one_by_one(seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    batched, running = random_manager(rng)
    reference = copy.deepcopy(batched)
    for _ in range(rounds):
        num_tokens = rng.choice([0, 1, 1, 1, 2, 5])
        grown = grow_computed(batched, named(rng, running), num_tokens)  # (ids, or holdings: the same growth)
        assert grown == grown_one_by_one(reference, running, num_tokens)
        assert state(batched) == state(reference)
        assert progress(batched) == progress(reference)
        assert batched.pending_copies == reference.pending_copies
        assert batched.num_copy_on_writes == reference.num_copy_on_writes
        assert batched.invariant_violations() == []
        if grown < len(running):  # the replay preempts the last one and tries again
            victim = running.pop()
            batched.release_sequence(victim)
            reference.release_sequence(victim)


def test_a_loading_sequence_goes_through_grow() -> None:
    # Block 4, prefix caching: 6 tokens reserved, 5 computed, 1 loading. Growing by one token computes all 7 (the
    # load's token with them: ``grow`` clears the loading count) and fills no block, takes none.
    managers = []
    for _ in range(2):
        manager = KVBlockManager(8, 4, enable_prefix_caching=True)
        manager.create_sequence(0, 6, block_hashes=hash_blocks(range(4)), num_computed_tokens=5).num_loading_tokens = 1
        managers.append(manager)
    assert grow_computed(managers[0], [0], 1) == 1
    managers[1].grow(0, 1)
    for manager in managers:
        sequence = manager.sequences[0]
        assert (sequence.sequence_length, sequence.num_computed_tokens, sequence.num_loading_tokens) == (7, 7, 0)


def test_the_compiled_growth_reads_a_holdings_id_itself() -> None:
    # Two decoding sequences named by holdings (one of a kind of its own): the compiled pass grows both, where an
    # item it could not read would send the growth to the Python path (None)
    loops = compiled()[1]
    manager = KVBlockManager(8, 4, enable_prefix_caching=True)
    manager.pool.loops = loops
    for sequence_id in (3, 5):
        manager.create_sequence(sequence_id, 5, block_hashes=hash_blocks(range(2 * sequence_id, 2 * sequence_id + 2)))
    assert loops.grow_batch(manager, [Holding(3, 5, 9), Held(5, 5, 9)], 2) == 2
    assert [manager.sequences[i].sequence_length for i in (3, 5)] == [7, 7]
    # grow_lengths takes ids alone, as its Python twin: a holding there is an unknown sequence to both (None)
    for twin in (loops, pool_loops.PYTHON):
        assert twin.grow_lengths(manager.sequences, [Holding(3, 5, 9)], 1, 4, 1, 8, 0) is None
    assert manager.sequences[3].sequence_length == 7
