"""The free queue (``memory/block_pool.py FreeBlockQueue``) against a naive list changed one block at a time: its
back part (an append-only list with stale entries skipped, compacted now and then) must hand out, hold and list
exactly the blocks, in exactly the order, that vLLM's doubly linked queue would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.free_queue import FreeBlockQueue
from tests.memory.conftest import compiled_loops

NUM_BLOCKS = 12
ROOT = Path(__file__).resolve().parents[2]


class NaiveQueue:
    """vLLM's order spelled out: one list, front first; never-used ids sit between the front and the back."""

    def __init__(self, num_blocks: int) -> None:
        self.front: list[int] = []
        self.untouched = list(range(num_blocks))
        self.back: list[int] = []

    def order(self) -> list[int]:
        return self.front + self.untouched + self.back

    def take(self, count: int) -> tuple[list[int], int]:
        taken = []
        from_back = 0
        for _ in range(count):
            for part in (self.front, self.untouched, self.back):
                if part:
                    from_back += part is self.back
                    taken.append(part.pop(0))
                    break
        return taken, from_back


# (operation, argument): take a count, free some held blocks to the front or the back, a hit on a back block
operations = st.lists(st.tuples(st.sampled_from(["take", "prepend", "append", "remove"]),
                                st.integers(0, NUM_BLOCKS)), max_size=60)


@pytest.mark.parametrize("compiled_remove", [False, True])
@settings(max_examples=200, deadline=None)
@given(operations)
def test_the_queue_hands_out_and_lists_blocks_as_a_naive_list_does(compiled_remove: bool,
                                                                    ops: list[tuple[str, int]]) -> None:
    """Hits taken out by the queue's own ``remove`` or by the compiled one (``pool_loops.remove_free``)."""
    queue, naive = FreeBlockQueue(NUM_BLOCKS), NaiveQueue(NUM_BLOCKS)
    held: list[int] = []  # blocks out of the queue, in the order taken
    for op, arg in ops:
        if op == "take":
            count = min(arg, len(queue))
            got = queue.take(count)
            assert got == naive.take(count)
            held += got[0]
        elif op in ("prepend", "append") and held:
            blocks, held = held[:arg], held[arg:]
            if op == "prepend":
                queue.prepend(blocks)
                naive.front[:0] = blocks
            else:
                queue.append(blocks)
                naive.back += blocks
        elif op == "remove" and naive.back:  # (a prompt's hits: one to three blocks of the back part in one call)
            blocks = naive.back[arg % len(naive.back):][:1 + arg % 3]
            if compiled_remove:
                assert compiled_loops().remove_free(queue, blocks) is True
            else:
                queue.remove(*blocks)
            for block in blocks:
                naive.back.remove(block)
            held += blocks
        assert list(queue) == naive.order()
        assert queue.touched() == (naive.front, naive.back)
        assert len(queue) == len(naive.order())


def test_a_block_hit_then_freed_again_is_handed_out_at_its_new_place_only() -> None:
    # Block 0 is freed, taken out by a hit, freed again behind block 1: its first entry is stale, skipped.
    queue = FreeBlockQueue(2)
    queue.take(2)
    queue.append([0, 1])
    queue.remove(0)
    queue.append([0])
    assert queue.touched() == ([], [1, 0])
    assert queue.take(2) == ([1, 0], 2)
    assert len(queue) == 0


def test_taking_more_blocks_than_are_free_fails_at_once() -> None:
    # The back part's walk looped forever when asked for more than it holds; in a subprocess with a timeout so
    # that the old code fails this test instead of hanging the suite.
    program = ("from minipaged_cli.memory.free_queue import FreeBlockQueue\n"
               "queue = FreeBlockQueue(2)\nqueue.take(2)\nqueue.append([0, 1])\nqueue.take(3)\n")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=20,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1
    assert "AssertionError: took 3 of 2 free blocks: the caller's can_allocate check is broken" in run.stderr


def test_a_hit_on_a_block_not_in_the_back_part_is_reported() -> None:
    # remove() records a stale entry without looking for the block (a hit is O(1)); the checker finds the lie.
    queue = FreeBlockQueue(6)
    queue.take(5)
    queue.append([0, 2, 3])
    assert queue.violations() == []
    queue.remove(1)  # held, not free: a broken caller (too few stale entries yet to compact them away)
    assert queue.violations() == ["blocks [1] were taken out of the free queue's back part more often than they "
                                  "sit in it: a hit on a block that was not free there"]


def test_a_miscounted_stale_entry_and_a_double_free_are_reported() -> None:
    queue = FreeBlockQueue(4)
    queue.take(3)
    queue.append([0, 1])
    queue.remove(0)
    queue._num_stale += 1
    assert queue.violations() == ["the free queue counts 2 stale entries but records 1: a hit counted in one "
                                  "place only"]
    queue._num_stale -= 1
    queue.append([1])
    assert queue.violations() == ["a block sits twice in the free queue's back part: a double free"]


def test_the_block_managers_checker_reports_a_corrupt_free_queue() -> None:
    # A miscounted stale entry breaks no count the checker compares with the tables: only the queue's own check
    # sees it.
    manager = KVBlockManager(num_physical_blocks=4, block_size=2, enable_prefix_caching=True)
    manager.create_sequence(0, 2)
    manager.create_sequence(1, 2)
    manager.pool.free_blocks._num_stale += 1
    assert manager.invariant_violations() == ["the free queue counts 1 stale entries but records 0: a hit counted "
                                              "in one place only"]
