"""KVBlockManager against the article's worked example and formulas worked by hand."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from minipaged_cli.memory.block_manager import (
    BlockManagerError,
    DoubleReleaseError,
    DuplicateSequenceError,
    FreeBlockQueue,
    KVBlockManager,
    OutOfBlocksError,
    SequenceState,
    UnknownSequenceError,
    tail_waste,
)


def snapshot(manager: KVBlockManager) -> tuple:
    return (list(manager.free_blocks), copy.deepcopy(manager.sequences))


def test_article_worked_example() -> None:
    # block_size 4, block_table [5, 2, 9, 1]: token 6 -> logical 1, offset 2, physical 2, slot 10.
    manager = KVBlockManager(num_physical_blocks=10, block_size=4)
    manager.free_blocks = FreeBlockQueue([5, 2, 9, 1, 0, 3, 4, 6, 7, 8])  # the order the pool hands blocks out
    manager.create_sequence(0)
    slots = manager.append_tokens(0, 16)
    assert manager.sequences[0].block_table == [5, 2, 9, 1]
    assert slots[6] == 10
    assert slots == [5 * 4 + o for o in range(4)] + [2 * 4 + o for o in range(4)] + \
        [9 * 4 + o for o in range(4)] + [1 * 4 + o for o in range(4)]


def test_append_token_takes_a_block_only_at_a_boundary() -> None:
    manager = KVBlockManager(num_physical_blocks=4, block_size=4)
    manager.create_sequence("s")
    slots = [manager.append_token("s") for _ in range(5)]
    assert slots == [0, 1, 2, 3, 4]  # blocks 0 then 1, handed out in order
    assert manager.sequences["s"] == SequenceState("s", 5, [0, 1])
    assert manager.num_free_blocks == 2


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 15, 16, 17, 33])
def test_tail_waste_is_zero_or_block_size_minus_remainder(block_size: int, length: int) -> None:
    manager = KVBlockManager(num_physical_blocks=64, block_size=block_size)
    manager.create_sequence(0)
    manager.append_tokens(0, length)
    expected = 0 if length % block_size == 0 else block_size - length % block_size
    assert manager.internal_fragmentation_tokens() == expected == tail_waste(length, block_size)


def test_slot_mapping_for_append_one_token_each() -> None:
    manager = KVBlockManager(num_physical_blocks=8, block_size=2)
    for sid in (0, 1):
        manager.create_sequence(sid)
    manager.append_tokens(0, 2)  # block 0 full
    manager.append_tokens(1, 1)  # block 1 half full
    slots = manager.slot_mapping_for_append([0, 1])
    # sequence 0 needs a new block (2): slot 4; sequence 1 fills block 1: slot 3
    assert slots == [4, 3]
    assert manager.get_seq_lens_tensor([0, 1]).tolist() == [3, 2]


def test_block_table_tensor_is_int32_padded_with_minus_one() -> None:
    manager = KVBlockManager(num_physical_blocks=8, block_size=2)
    manager.create_sequence("a")
    manager.create_sequence("b")
    manager.append_tokens("a", 5)  # blocks 0, 1, 2
    manager.append_tokens("b", 1)  # block 3
    table = manager.get_block_table_tensor(["b", "a"])
    assert table.dtype == np.int32
    assert table.tolist() == [[3, -1, -1], [0, 1, 2]]
    lens = manager.get_seq_lens_tensor(["b", "a"])
    assert lens.dtype == np.int32 and lens.tolist() == [1, 5]


def test_tensors_as_torch() -> None:
    torch = pytest.importorskip("torch")
    manager = KVBlockManager(num_physical_blocks=4, block_size=2)
    manager.create_sequence(0)
    manager.append_tokens(0, 3)
    table = manager.get_block_table_tensor([0], as_torch=True)
    assert isinstance(table, torch.Tensor) and table.dtype == torch.int32 and table.tolist() == [[0, 1]]
    assert manager.get_seq_lens_tensor([0], as_torch=True).dtype == torch.int32


def test_release_returns_blocks_to_the_back_of_the_free_queue() -> None:
    manager = KVBlockManager(num_physical_blocks=4, block_size=2)
    manager.create_sequence(0)
    manager.append_tokens(0, 3)  # blocks 0, 1
    manager.release_sequence(0)
    assert list(manager.free_blocks) == [2, 3, 0, 1]
    assert manager.invariants_ok()


def test_out_of_blocks_leaves_state_unchanged() -> None:
    manager = KVBlockManager(num_physical_blocks=3, block_size=4)
    manager.create_sequence(0)
    manager.append_tokens(0, 9)  # 3 blocks, one slot used in the last
    before = snapshot(manager)
    with pytest.raises(OutOfBlocksError):
        manager.append_tokens(0, 4)  # fits 3 more, needs a fourth block: nothing may change
    assert snapshot(manager) == before
    manager.create_sequence(1)
    with pytest.raises(OutOfBlocksError):
        manager.append_token(1)
    assert manager.sequences[1].block_table == [] and manager.invariants_ok()


def test_slot_mapping_for_append_is_all_or_nothing() -> None:
    manager = KVBlockManager(num_physical_blocks=3, block_size=2)
    for sid in (0, 1, 2):
        manager.create_sequence(sid)
        manager.append_tokens(sid, 2)  # every block full
    before = snapshot(manager)
    with pytest.raises(OutOfBlocksError):
        manager.slot_mapping_for_append([0, 1, 2])
    assert snapshot(manager) == before


def test_errors_name_the_problem_and_change_nothing() -> None:
    manager = KVBlockManager(num_physical_blocks=4, block_size=2)
    manager.create_sequence(7)
    manager.append_tokens(7, 3)
    before = snapshot(manager)
    with pytest.raises(DuplicateSequenceError, match="7"):
        manager.create_sequence(7)
    with pytest.raises(UnknownSequenceError, match="unknown sequence 8"):
        manager.append_token(8)
    assert snapshot(manager) == before
    manager.release_sequence(7)
    with pytest.raises(DoubleReleaseError, match="already released"):
        manager.release_sequence(7)
    with pytest.raises(UnknownSequenceError, match="released"):
        manager.append_token(7)
    assert all(issubclass(e, BlockManagerError) for e in
               (OutOfBlocksError, UnknownSequenceError, DuplicateSequenceError, DoubleReleaseError))
    manager.create_sequence(7)  # an id may be reused after its release
    assert manager.invariants_ok()


def test_can_allocate_counts_the_partly_filled_last_block() -> None:
    manager = KVBlockManager(num_physical_blocks=2, block_size=4)
    assert manager.can_allocate(8) and not manager.can_allocate(9)
    manager.create_sequence(0)
    manager.append_tokens(0, 5)  # blocks 0, 1; 3 slots left in block 1
    assert manager.can_allocate(3, 0) and not manager.can_allocate(4, 0)
    assert not manager.can_allocate(1)  # a new sequence needs a block and none is free


def test_invariant_violations_name_the_bug() -> None:
    manager = KVBlockManager(num_physical_blocks=4, block_size=2)
    manager.create_sequence(0)
    manager.append_tokens(0, 2)
    manager.create_sequence(1)
    manager.append_tokens(1, 2)
    manager.sequences[1].block_table[0] = manager.sequences[0].block_table[0]  # corrupt: shared block
    problems = manager.invariant_violations()
    assert any("2 tables hold it" in p and "two sequences given one block" in p for p in problems)
    assert any("leaked" in p for p in problems)
    assert not manager.invariants_ok()
