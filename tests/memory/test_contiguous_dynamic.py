"""The dynamic (doubling) contiguous allocator at max_model_len: it must answer, not loop, when a request's final
length is past the cap (the audit found largest_need and try_grow looping forever; only callers guarded them)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.contiguous import DynamicAllocator


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail, rather than hang the suite, if the block runs past ``seconds`` (the bug was an endless loop)."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: an endless doubling loop")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_largest_need_stops_at_max_model_len() -> None:
    allocator = DynamicAllocator(capacity_tokens=1000, max_model_len=100)
    # prompt 60 -> first extent 64 (the next power of two above 60); final length 60 + 100 - 1 = 159 > 100
    with deadline(5):
        assert allocator.largest_need(Holding(0, 60, 100)) == 100
    assert allocator.largest_need(Holding(1, 60, 10)) == 100  # final 69: 64 doubles to 128, capped at 100
    assert allocator.largest_need(Holding(2, 60, 5)) == 64  # final 64 fits the first extent


def test_try_grow_refuses_past_max_model_len_and_changes_nothing() -> None:
    allocator = DynamicAllocator(capacity_tokens=1000, max_model_len=100)
    holding = Holding(0, 60, 100)
    assert allocator.can_admit(holding, 60)
    allocator.admit(holding, 60)
    assert allocator.try_grow(holding, 64, 65) == 0 and allocator.allocated(holding) == 100  # doubled, capped
    extents = dict(allocator.arena.extents)
    with deadline(5):
        assert allocator.try_grow(holding, 100, 101) is None
    assert allocator.arena.extents == extents and allocator.invariant_violations() == []
