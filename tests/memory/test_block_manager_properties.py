"""Random operation sequences against a naive model of the block manager, invariants after every step.

The model keeps, per sequence, the list of slots its tokens were given, and the free queue as a plain list in
vLLM v1's order (allocation pops the front; a released sequence's blocks, tail first, are put back at the front);
the manager must agree with it on every block id, on lengths, on the free-block count ceil(L / B) arithmetic, and
must never hand one slot to two tokens.
"""

from __future__ import annotations

import copy

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from minipaged_cli.dataplane.block_tables import append_slots
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.sequence import (
    BlockManagerError,
    DoubleReleaseError,
    DuplicateSequenceError,
    OutOfBlocksError,
    UnknownSequenceError,
)
from tests.memory.conftest import LOOP_KINDS

pytestmark = LOOP_KINDS  # (each test with the Python loops, then the compiled ones)

SEQUENCE_IDS = st.integers(min_value=0, max_value=7)


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 2, 3, 4, 16]))
    def setup(self, num_blocks: int, block_size: int) -> None:
        self.manager = KVBlockManager(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.slots: dict[int, list[int]] = {}  # the model: every live sequence's token slots in order
        self.free_queue = list(range(num_blocks))  # the model's free queue, front first
        self.released: set[int] = set()

    def blocks_held(self, length: int) -> int:
        return -(-length // self.block_size)

    def free_in_model(self) -> int:
        return self.num_blocks - sum(self.blocks_held(len(s)) for s in self.slots.values())

    def expect_unchanged(self, error: type[BlockManagerError], call, *args) -> None:
        before = (list(self.manager.pool.free_blocks), copy.deepcopy(self.manager.sequences))
        try:
            call(*args)
        except error:
            assert (list(self.manager.pool.free_blocks), copy.deepcopy(self.manager.sequences)) == before
        else:
            raise AssertionError(f"expected {error.__name__}")

    @rule(sid=SEQUENCE_IDS)
    def create(self, sid: int) -> None:
        if sid in self.slots:
            self.expect_unchanged(DuplicateSequenceError, self.manager.create_sequence, sid)
        else:
            self.manager.create_sequence(sid)
            self.slots[sid] = []
            self.released.discard(sid)

    @rule(sid=SEQUENCE_IDS, num_tokens=st.integers(0, 40))
    def append_tokens(self, sid: int, num_tokens: int) -> None:
        if sid not in self.slots:
            self.expect_unchanged(UnknownSequenceError, self.manager.grow, sid, num_tokens)
            return
        length = len(self.slots[sid])
        needed = self.blocks_held(length + num_tokens) - self.blocks_held(length)
        if needed > self.free_in_model():
            self.expect_unchanged(OutOfBlocksError, self.manager.grow, sid, num_tokens)
            return
        table = [slot // self.block_size for slot in self.slots[sid][:: self.block_size]]
        table += [self.free_queue.pop(0) for _ in range(needed)]
        self.slots[sid].extend(append_slots(self.manager, sid, num_tokens))
        assert self.manager.sequences[sid].block_table == table

    @rule(sid=SEQUENCE_IDS)
    def release(self, sid: int) -> None:
        if sid in self.slots:
            table = self.manager.sequences[sid].block_table
            self.free_queue[:0] = table[::-1]
            self.manager.release_sequence(sid)
            del self.slots[sid]
            self.released.add(sid)
        elif sid in self.released:
            self.expect_unchanged(DoubleReleaseError, self.manager.release_sequence, sid)
        else:
            self.expect_unchanged(UnknownSequenceError, self.manager.release_sequence, sid)

    @precondition(lambda self: hasattr(self, "manager"))
    @invariant()
    def agrees_with_the_model(self) -> None:
        assert self.manager.invariant_violations() == []
        assert self.manager.num_free_blocks == self.free_in_model()
        assert list(self.manager.pool.free_blocks) == self.free_queue
        all_slots = [slot for slots in self.slots.values() for slot in slots]
        assert len(all_slots) == len(set(all_slots)), "two tokens share a slot"
        for sid, slots in self.slots.items():
            state = self.manager.sequences[sid]
            assert state.sequence_length == len(slots)
            # slot = block_table[pos // B] * B + pos % B, for every token the sequence was given
            assert slots == [state.block_table[p // self.block_size] * self.block_size + p % self.block_size
                             for p in range(len(slots))]
        expected_unfilled = sum(self.blocks_held(len(s)) * self.block_size - len(s) for s in self.slots.values())
        assert self.manager.num_unfilled_slots == expected_unfilled


def test_the_block_manager_keeps_its_invariants() -> None:
    run_state_machine_as_test(BlockManagerMachine,
                              settings=settings(max_examples=150, stateful_step_count=40, deadline=None))
