"""The contiguous arena against a naive slot-by-slot reference, and the strategies' extent sizes by hand."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.contiguous import (
    ContiguousArena,
    DynamicAllocator,
    MaxReserveAllocator,
    OracleReserveAllocator,
    Pow2ReserveAllocator,
    next_power_of_two,
)
from minipaged_cli.memory.paged import PagedAllocator


def naive_first_fit(occupied: list[bool], size: int) -> int | None:
    """The lowest start of `size` free slots in a row."""
    run = 0
    for index, used in enumerate(occupied):
        run = 0 if used else run + 1
        if run == size:
            return index - size + 1
    return None


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 64),
       operations=st.lists(st.tuples(st.sampled_from(["alloc", "free", "extend"]), st.integers(1, 20)),
                           max_size=60))
def test_arena_matches_a_slot_by_slot_reference(capacity: int, operations: list[tuple[str, int]]) -> None:
    arena = ContiguousArena(capacity)
    occupied = [False] * capacity
    owners: list[int] = []
    next_owner = 0
    for action, number in operations:
        if action == "alloc":
            expected = naive_first_fit(occupied, number)
            assert arena.allocate(next_owner, number) == (expected is not None)
            if expected is not None:
                assert arena.extents[next_owner] == (expected, number)
                occupied[expected:expected + number] = [True] * number
                owners.append(next_owner)
            next_owner += 1
        elif owners:
            owner = owners[number % len(owners)]
            start, size = arena.extents[owner]
            if action == "free":
                arena.free(owner)
                occupied[start:start + size] = [False] * size
                owners.remove(owner)
            else:
                fits = start + size + number <= capacity and not any(occupied[start + size:start + size + number])
                assert arena.extend_in_place(owner, size + number) == fits
                if fits:
                    occupied[start + size:start + size + number] = [True] * number
        assert arena.invariant_violations() == []
        assert arena.used == sum(occupied)
        # holes are exactly the maximal free runs
        runs, start = [], None
        for index, used in enumerate([*occupied, True]):
            if not used and start is None:
                start = index
            elif used and start is not None:
                runs.append((start, index - start))
                start = None
        assert list(zip(arena.hole_starts, arena.hole_sizes, strict=True)) == runs


def test_extent_sizes_by_hand() -> None:
    request = Holding(0, prompt_tokens=300, output_tokens=250)  # 550 tokens in all, final length 549
    assert MaxReserveAllocator(10_000, 2048).extent_size(request, 300) == 2048
    assert Pow2ReserveAllocator(10_000, 2048).extent_size(request, 300) == 1024
    assert Pow2ReserveAllocator(10_000, 800).extent_size(request, 300) == 800  # capped at max_model_len
    assert OracleReserveAllocator(10_000, 2048).extent_size(request, 300) == 550
    assert DynamicAllocator(10_000, 2048).extent_size(request, 300) == 512  # room for the prompt and one token
    assert DynamicAllocator(10_000, 2048).largest_need(request) == 1024
    assert PagedAllocator(100, 16).largest_need(request) == 560  # ceil(549 / 16) = 35 blocks
    assert [next_power_of_two(n) for n in (1, 2, 3, 512, 513)] == [1, 2, 4, 512, 1024]


def test_dynamic_doubles_in_place_then_moves_with_a_copy() -> None:
    allocator = DynamicAllocator(100, 64)
    a, b = Holding(0, 7, 40), Holding(1, 7, 40)
    allocator.admit(a, 7)  # [0, 8)
    assert allocator.try_grow(a, 8, 9) == 0 and allocator.arena.extents[0] == (0, 16)  # in place
    allocator.admit(b, 7)  # [16, 24)
    assert allocator.try_grow(a, 16, 17) == 16  # b sits right after a: move to a new extent, copy 16 tokens
    assert allocator.arena.extents[0] == (24, 32)
    assert allocator.arena.hole_starts[0] == 0 and allocator.arena.hole_sizes[0] == 16
    assert allocator.invariant_violations() == []


def test_failed_growth_changes_nothing() -> None:
    allocator = DynamicAllocator(24, 64)
    a, b = Holding(0, 7, 40), Holding(1, 7, 40)
    allocator.admit(a, 7)  # [0, 8)
    allocator.admit(b, 7)  # [8, 16)
    before = (list(allocator.arena.hole_starts), list(allocator.arena.hole_sizes), dict(allocator.arena.extents))
    assert allocator.try_grow(a, 8, 9) is None  # needs 16 contiguous slots: only 8 are free
    assert (allocator.arena.hole_starts, allocator.arena.hole_sizes, allocator.arena.extents) == before


def test_external_fragmentation_counts_holes_below_the_smallest_need() -> None:
    allocator = OracleReserveAllocator(40, 64)
    # Extents of 15, 10 and 15 fill the 40 slots; the fourth request (5) finds no room.
    for i, (prompt, output) in enumerate([(10, 5), (5, 5), (10, 5), (2, 3)]):
        if allocator.can_admit(Holding(i, prompt, output), prompt):
            allocator.admit(Holding(i, prompt, output), prompt)
    allocator.release(Holding(1, 5, 5))  # hole [15, 25)
    assert allocator.external_fragmentation(smallest_need=12) == 10
    assert allocator.external_fragmentation(smallest_need=10) == 0
    assert PagedAllocator(10, 4).external_fragmentation(smallest_need=1000) == 0
