"""The tier stores' batch calls (``memory/tier_store.py``) against a naive LRU stored one block at a time: the
fast paths (a batch of new blocks appended at once and evicted after, a hit's moves in C) must store, order and
evict exactly as one block at a time would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.tier_store import ARCStore, LRUStore


class NaiveLRU:
    """A list, least recently used first, changed one block at a time."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.reserved, self.order = capacity, 0, []

    def insert(self, hashes: list[int]) -> list[int]:
        evicted = []
        if self.capacity - self.reserved < 1:
            return evicted
        for h in hashes:
            if h in self.order:
                self.order.remove(h)
            elif len(self.order) >= self.capacity - self.reserved:
                evicted.append(self._victim())
                self.order.remove(evicted[-1])
            self.order.append(h)
        return evicted

    def _victim(self) -> int:
        """The block eviction takes: the least recently used."""
        return self.order[0]

    def hit(self, hashes: list[int]) -> list[bool]:
        held = [h in self.order for h in hashes]
        for h, is_held in zip(hashes, held, strict=True):
            if is_held:
                self.order.remove(h)
                self.order.append(h)
        return held

    def reserve(self, num_slots: int) -> list[int]:
        self.reserved += num_slots
        evicted = self.order[:max(len(self.order) - (self.capacity - self.reserved), 0)]
        del self.order[:len(evicted)]
        return evicted


operation = st.tuples(st.sampled_from(["insert", "insert_new", "refresh", "hit", "reserve"]),
                      st.lists(st.integers(0, 15), max_size=8))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.lists(operation, max_size=40))
def test_lru_batches_match_one_block_at_a_time(capacity: int, operations: list[tuple[str, list[int]]]) -> None:
    store, naive = LRUStore(capacity), NaiveLRU(capacity)
    for name, hashes in operations:
        if name == "insert":
            assert store.insert(hashes) == naive.insert(hashes)
        elif name == "insert_new":  # its precondition: each named once, none stored
            new = [h for h in dict.fromkeys(hashes) if h not in naive.order]
            assert store.insert_new(new) == naive.insert(new)
        elif name == "refresh":  # its precondition: each stored (named once or more)
            again = [h for h in hashes if h in naive.order]
            store.refresh(again)
            naive.insert(again)
        elif name == "hit":
            assert store.hit(hashes) == naive.hit(hashes)
        elif store.can_reserve(1):
            assert store.reserve(1) == naive.reserve(1)
        assert store.hashes() == naive.order  # the same blocks, in the same order: the same evictions to come
        assert store.num_evictions >= 0 and not store.violations()


def test_arc_hit_says_which_blocks_it_holds() -> None:
    arc = ARCStore(3)
    assert arc.insert_new(["a", "b"]) == []
    assert arc.hit(["b", "z", "a"]) == [True, False, True]
    assert arc.hashes() == ["b", "a"]  # both reused: in T2, the last most recently
