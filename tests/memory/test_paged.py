"""The paged allocator's fast paths against their naive references (the replay's decode steps profiled in bulk, the
slot owners of a huge pool, the accounting's sums, the compiled admission headroom), and the block manager's checker
on a planted bug."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory import hash_blocks
from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.memory.paged import PagedAllocator
from minipaged_cli.workloads.presets import FULL_ATTENTION, SLIDING_ATTENTION
from tests.memory.conftest import compiled_loops


def length_matrix_profile(lengths: np.ndarray, allocated: np.ndarray, finals: np.ndarray, num_steps: int,
                          block_size: int, num_free: int) -> tuple[int, np.ndarray, np.ndarray]:
    """The naive reference: every request's allocation at every step, as a [n, k] matrix (what ``bulk_profile``
    computed before it counted residues)."""
    length_matrix = lengths[:, None] + np.arange(1, num_steps + 1)[None, :]
    allocated_matrix = -(-length_matrix // block_size) * block_size
    allocated_per_step = allocated_matrix.sum(axis=0)
    new_blocks = (allocated_per_step - allocated.sum()) // block_size
    num_ok = int(np.searchsorted(new_blocks, num_free, side="right"))
    internal = np.maximum(allocated_matrix[:, :num_ok] - finals[:, None], 0).sum(axis=0)
    return num_ok, allocated_per_step[:num_ok], internal


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_bulk_profile_equals_the_length_matrix(block_size: int) -> None:
    # Integers throughout, so the two must agree exactly; the cases include tables a block longer or shorter than
    # the lengths need (a shared block, a copy) and finals below the lengths, which the replay never passes.
    rng = np.random.default_rng(21)
    for _ in range(300):
        n, num_steps = int(rng.integers(1, 20)), int(rng.integers(1, 120))
        lengths = rng.integers(0, 200, n)
        allocated = -(-lengths // block_size) * block_size + block_size * rng.integers(-1, 2, n)
        finals = lengths + rng.integers(-4, 150, n)
        num_free = int(rng.integers(0, n * num_steps // block_size + 2))
        allocator = PagedAllocator(num_free + 1, block_size)
        allocator.manager.create_sequence("elsewhere", 1)  # one block held: num_free left, none at all included
        profile = allocator.bulk_profile(lengths, allocated, finals, num_steps)
        num_ok, allocated_per_step, internal = length_matrix_profile(lengths, allocated, finals, num_steps,
                                                                     block_size, num_free)
        assert profile.num_steps == num_ok
        assert np.array_equal(profile.allocated, allocated_per_step)
        assert np.array_equal(np.broadcast_to(profile.internal, num_ok), internal)


def test_the_checker_names_a_free_count_that_disagrees_with_the_queue() -> None:
    manager = KVBlockManager(8, 4)
    manager.create_sequence("a", 9)
    manager.release_sequence("a")
    assert manager.num_free_blocks == 8 and manager.invariant_violations() == []
    manager.pool.free_blocks.num_free -= 1  # a planted bug: a move that forgot the count
    assert any("counts 7 free blocks but holds 8" in problem for problem in manager.invariant_violations())


def test_slot_owners_of_a_huge_pool_cost_the_blocks_in_use() -> None:
    # 2**40 blocks: an owner per block would take 8 TiB (simulate --plot-layout --num-blocks ...); the pool itself
    # keeps state only for the blocks it handed out.
    paged = PagedAllocator(num_blocks=2**40, block_size=4)
    paged.admit(Holding(7, 6, 1), 6)  # blocks 0 and 1: slots 0-7, tokens in 0-5
    paged.admit(Holding(9, 1, 1), 1)  # block 2
    assert paged.slot_owners(np.array([0, 5, 7, 8, 12, 4 * 2**40 - 1])).tolist() == [7, 7, 7, 9, -1, -1]


def naive_allocation_sums(allocator: PagedAllocator, holdings: list[Holding]) -> tuple[int, int]:
    """The reference: each request's blocks held, from its table, and its slots past its final length, summed."""
    allocated = [len(allocator.manager.sequences[h.sequence_id].block_table) * allocator.block_size for h in holdings]
    return sum(allocated), sum(max(slots - h.final_length, 0) for slots, h in zip(allocated, holdings, strict=True))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_allocation_sums_from_the_pool_equal_the_per_request_sums(seed: int) -> None:
    """Requests admitted (in chunks, whole, sharing cached prefixes), grown one by one and in runs, released, some
    finishing inside their last block: after every call the sums from the pool's counts and the manager's list of
    sequences in their last block equal the sums request by request, and the list holds exactly those sequences."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    allocator = PagedAllocator(rng.randint(8, 60), block_size, prefix_caching=rng.random() < 0.7)
    manager = allocator.manager
    shared = [("shared", i) for i in range(8)]
    live: list[Holding] = []
    lengths: dict[int, int] = {}
    for sequence_id in range(rng.randint(1, 40)):
        call = rng.random()
        if call < 0.35 or not live:
            prompt, output = rng.randint(1, 6 * block_size), rng.randint(1, 4 * block_size)
            holding = Holding(sequence_id, prompt, output, hash_blocks(
                shared[:rng.randint(0, 8)] + [("own", sequence_id, i) for i in range(prompt // block_size + 4)]))
            first = rng.choice([prompt, rng.randint(1, prompt)])
            if allocator.blocks_to_admit(holding, prompt) <= manager.num_free_blocks:
                allocator.admit(holding, prompt, first, first_chunk_only=rng.random() < 0.5)
                live.append(holding)
                lengths[sequence_id] = manager.sequences[sequence_id].sequence_length
        elif call < 0.6:
            holding = rng.choice(live)
            length = lengths[holding.sequence_id]
            if length < holding.final_length:
                new_length = min(holding.final_length, length + rng.randint(1, 2 * block_size))
                if allocator.try_grow(holding, length, new_length) is not None:
                    lengths[holding.sequence_id] = new_length
        elif call < 0.85:
            run = [h for h in live if lengths[h.sequence_id] < h.final_length
                   and manager.sequences[h.sequence_id].num_computed_tokens == lengths[h.sequence_id]]
            for holding in run[:allocator.grow_decodes(run)]:
                lengths[holding.sequence_id] += 1
        else:
            holding = live.pop(rng.randrange(len(live)))
            allocator.release(holding)
            del lengths[holding.sequence_id]
        assert allocator.allocation_sums(live) == naive_allocation_sums(allocator, live)
        assert allocator.bulk_allocations(live) == naive_allocation_sums(allocator, live)[0]
        some = live[:rng.randint(0, len(live))]  # (not all the live ones: the pass over them)
        assert allocator.allocation_sums(some) == naive_allocation_sums(allocator, some)
        assert allocator.bulk_allocations(some) == naive_allocation_sums(allocator, some)[0]
        assert manager.past_final == {
            s.sequence_id: s for s in manager.sequences.values()
            if len(s.block_table) * block_size > s.final_length}  # type: ignore[operator]


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_the_compiled_admission_headroom_is_the_gates_count(seed: int) -> None:
    """``pool_loops.admission_headroom`` (compiled) against the gate's count in Python (``blocks_to_admit``): on
    random pools of one or two full-attention groups or a sliding one, with prefix caching or not, holding prompts
    that share cached documents (some released: their cached blocks free), each waiting prompt (none, some or all
    of its keys cached, of any length down to 0) gets the same headroom, or None where a group slides or a hit is
    possible in two groups. With one group every answer is compiled, hits included."""
    loops = compiled_loops()
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    layout = rng.choice([(FULL_ATTENTION,), (FULL_ATTENTION, FULL_ATTENTION), (SLIDING_ATTENTION, FULL_ATTENTION)])
    groups = [KVCacheGroup(kind, (i,), 1, 6 if kind == SLIDING_ATTENTION else None) for i, kind in enumerate(layout)]
    allocator = PagedAllocator(rng.randint(8, 60), block_size, groups, prefix_caching=rng.random() < 0.7)
    manager = allocator.manager
    shared = [("shared", i) for i in range(8)]
    answered = 0
    for sequence_id in range(rng.randint(1, 30)):
        prompt = rng.randint(0, 6 * block_size)
        keys = hash_blocks(shared[:rng.randint(0, 8)] + [("own", sequence_id, i) for i in range(prompt // block_size)])
        holding = Holding(sequence_id, max(prompt, 1), 1, keys[:rng.randint(0, len(keys))])
        keep = rng.randint(0, 3)
        expected = (manager.num_free_blocks - allocator.blocks_to_admit(holding, prompt) - keep) * block_size
        headroom = loops.admission_headroom(manager, holding.block_hashes, prompt, keep)
        assert headroom is None or headroom == expected
        assert headroom is not None or len(layout) > 1
        answered += headroom is not None
        if prompt and allocator.blocks_to_admit(holding, prompt) <= manager.num_free_blocks:
            allocator.admit(holding, prompt)
        if manager.sequences and rng.random() < 0.4:  # (its cached blocks free: a hit on them takes them)
            allocator.release(Holding(rng.choice(sorted(manager.sequences)), 1, 1))
    if layout[0] != SLIDING_ATTENTION:
        assert answered > 0
    else:
        assert answered == 0
