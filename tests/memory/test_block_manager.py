"""KVBlockManager against the article's worked example and formulas worked by hand."""

from __future__ import annotations

import copy
import tracemalloc

import numpy as np
import pytest

from minipaged_cli.dataplane.block_tables import append_slots, block_table_tensor, seq_lens_tensor, slot_mapping
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.sequence import (
    BlockManagerError,
    DoubleReleaseError,
    DuplicateSequenceError,
    OutOfBlocksError,
    SequenceState,
    UnknownSequenceError,
    tail_waste,
)


def snapshot(manager: KVBlockManager) -> tuple:
    return (list(manager.pool.free_blocks), copy.deepcopy(manager.sequences))


def test_article_worked_example() -> None:
    # block_size 4, block_table [5, 2, 9, 1]: token 6 -> logical 1, offset 2, physical 2, slot 10.
    manager = KVBlockManager(num_physical_blocks=10, block_size=4)
    for block in range(10):  # one block each: sequence i holds block i
        manager.create_sequence(block, 1)
    for block in (1, 9, 2, 5):  # a freed block goes to the front of the free queue: 5 is handed out next
        manager.release_sequence(block)
    manager.create_sequence("s")
    slots = append_slots(manager, "s", 16)
    assert manager.sequences["s"].block_table == [5, 2, 9, 1]
    assert slots[6] == 10
    assert slots == [5 * 4 + o for o in range(4)] + [2 * 4 + o for o in range(4)] + \
        [9 * 4 + o for o in range(4)] + [1 * 4 + o for o in range(4)]


def test_grow_takes_a_block_only_at_a_boundary() -> None:
    manager = KVBlockManager(num_physical_blocks=4, block_size=4)
    manager.create_sequence("s")
    slots = [slot for _ in range(5) for slot in append_slots(manager, "s", 1)]
    assert slots == [0, 1, 2, 3, 4]  # blocks 0 then 1, handed out in order
    assert manager.sequences["s"] == SequenceState("s", 5, [[0, 1]])
    assert manager.num_free_blocks == 2


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 15, 16, 17, 33])
def test_unfilled_slots_are_zero_or_block_size_minus_remainder(block_size: int, length: int) -> None:
    manager = KVBlockManager(num_physical_blocks=64, block_size=block_size)
    manager.create_sequence(0, length)
    expected = 0 if length % block_size == 0 else block_size - length % block_size
    assert manager.num_unfilled_slots == expected == tail_waste(length, block_size)


def test_slot_mapping_follows_the_block_table() -> None:
    # slot = block_table[pos // B] * B + pos % B, worked by hand for table [7, 3], B = 4
    assert slot_mapping([7, 3], 4, np.arange(8)).tolist() == [28, 29, 30, 31, 12, 13, 14, 15]
    assert slot_mapping([7, 3], 4, np.array([5])).dtype == np.int64


def test_block_table_tensor_is_int32_padded_with_minus_one() -> None:
    manager = KVBlockManager(num_physical_blocks=8, block_size=2)
    manager.create_sequence("a", 5)  # blocks 0, 1, 2
    manager.create_sequence("b", 1)  # block 3
    table = block_table_tensor(manager, ["b", "a"])
    assert table.dtype == np.int32
    assert table.tolist() == [[3, -1, -1], [0, 1, 2]]
    lens = seq_lens_tensor(manager, ["b", "a"])
    assert lens.dtype == np.int32 and lens.tolist() == [1, 5]
    with pytest.raises(UnknownSequenceError, match="unknown sequence 'c'"):
        block_table_tensor(manager, ["c"])


def test_tensors_as_torch() -> None:
    torch = pytest.importorskip("torch")
    manager = KVBlockManager(num_physical_blocks=4, block_size=2)
    manager.create_sequence(0, 3)
    table = block_table_tensor(manager, [0], as_torch=True)
    assert isinstance(table, torch.Tensor) and table.dtype == torch.int32 and table.tolist() == [[0, 1]]
    assert seq_lens_tensor(manager, [0], as_torch=True).dtype == torch.int32


def test_release_returns_blocks_tail_first_to_the_front_of_the_free_queue() -> None:
    # vLLM 0.33.0: SingleTypeKVCacheManager.free passes reversed(blocks) to BlockPool.free_blocks, which prepends
    # the blocks without a hash (all of them without prefix caching) in that order: [1, 0] before the untouched 2, 3.
    manager = KVBlockManager(num_physical_blocks=4, block_size=2)
    manager.create_sequence(0, 3)  # blocks 0, 1
    manager.release_sequence(0)
    assert list(manager.pool.free_blocks) == [1, 0, 2, 3]
    assert manager.create_sequence(1, 2).block_table == [1]
    assert manager.invariants_ok()


def test_out_of_blocks_leaves_state_unchanged() -> None:
    manager = KVBlockManager(num_physical_blocks=3, block_size=4)
    manager.create_sequence(0, 9)  # 3 blocks, one slot used in the last
    before = snapshot(manager)
    with pytest.raises(OutOfBlocksError):
        manager.grow(0, 4)  # fits 3 more, needs a fourth block: nothing may change
    assert snapshot(manager) == before
    manager.create_sequence(1)
    with pytest.raises(OutOfBlocksError):
        manager.grow(1, 1)
    assert manager.sequences[1].block_table == [] and manager.invariants_ok()


def test_errors_name_the_problem_and_change_nothing() -> None:
    manager = KVBlockManager(num_physical_blocks=4, block_size=2)
    manager.create_sequence(7, 3)
    before = snapshot(manager)
    with pytest.raises(DuplicateSequenceError, match="7"):
        manager.create_sequence(7)
    with pytest.raises(UnknownSequenceError, match="unknown sequence 8"):
        manager.grow(8, 1)
    assert snapshot(manager) == before
    manager.release_sequence(7)
    with pytest.raises(DoubleReleaseError, match="already released"):
        manager.release_sequence(7)
    with pytest.raises(UnknownSequenceError, match="released"):
        manager.grow(7, 1)
    assert all(issubclass(e, BlockManagerError) for e in
               (OutOfBlocksError, UnknownSequenceError, DuplicateSequenceError, DoubleReleaseError))
    manager.create_sequence(7)  # an id may be reused after its release
    assert manager.invariants_ok()


def test_released_ids_are_remembered_boundedly() -> None:
    # The audit: a set of every released id grew for the whole replay. Only the recent ones are kept; an old id
    # released again is still refused, as an unknown sequence.
    manager = KVBlockManager(num_physical_blocks=4, block_size=2)
    for sid in range(5000):
        manager.create_sequence(sid, 1)
        manager.release_sequence(sid)
    assert len(manager._released) <= 1024
    with pytest.raises(DoubleReleaseError):
        manager.release_sequence(4999)
    with pytest.raises(UnknownSequenceError, match="unknown sequence 0"):
        manager.release_sequence(0)


def test_blocks_needed_counts_the_partly_filled_last_block() -> None:
    manager = KVBlockManager(num_physical_blocks=2, block_size=4)
    assert manager.blocks_needed(None, 8) == 2 and manager.blocks_needed(None, 9) == 3
    manager.create_sequence(0, 5)  # blocks 0, 1; 3 slots left in block 1
    assert manager.blocks_needed(0, 3) == 0 and manager.blocks_needed(0, 4) == 1
    assert manager.blocks_needed(None, 1) == 1 > manager.num_free_blocks  # a new sequence needs a block


def test_invariant_violations_name_the_bug() -> None:
    manager = KVBlockManager(num_physical_blocks=4, block_size=2)
    manager.create_sequence(0, 2)
    manager.create_sequence(1, 2)
    manager.sequences[1].block_table[0] = manager.sequences[0].block_table[0]  # corrupt: shared block
    problems = manager.invariant_violations()
    assert any("2 tables hold it" in p and "two sequences given one block" in p for p in problems)
    assert any("leaked" in p for p in problems)
    assert not manager.invariants_ok()
    manager.sequences[1].block_table[0] = 3  # a block the pool never handed out
    assert any("outside the 2 blocks the pool handed out" in p for p in manager.invariant_violations())


def test_a_pool_costs_memory_only_for_the_blocks_it_used() -> None:
    # The audit: --num-blocks 1000000000 filled a deque of a billion ids (2.3 GB, 7 s). Untouched ids are a counter;
    # per-block state exists for the blocks handed out so far, so even a billion-block pool fits in kilobytes.
    for num_blocks in (10**6, 10**9):
        tracemalloc.start()
        manager = KVBlockManager(num_blocks, 16, enable_prefix_caching=True)
        for sid in range(8):
            manager.create_sequence(sid, 100)  # 7 blocks each
        for sid in range(0, 8, 2):
            manager.release_sequence(sid)
        manager.create_sequence("again", 100)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 64 * 1024, (num_blocks, peak)
        assert manager.num_free_blocks == num_blocks - 5 * 7
        assert manager.pool.free_blocks.num_touched == 8 * 7
        assert manager.invariant_violations() == []
