"""Which blocks one tier below the GPU holds, and which it gives up for a new one (vLLM's offloading
``CachePolicy``: ``vllm/v1/kv_offload/cpu/policies/``, LRU and ARC).

Over 300 lines: the base and its two policies, whose evictions must each honour the base's reservations, pins and
leaving blocks; kept together so that the rules and the code that keeps them read side by side.

A tier holds content, not positions: its entries are block hashes (the prefix cache's keys), at most
``capacity`` of them. ``insert`` stores some (evicting to make room, and returning what it evicted), ``hit`` says
that a request reused stored blocks, which is what the policies order by. Both take a step's or a request's
blocks at once: a replay stores millions, and the dict operations on stores that large are what a replay with
tiers spends its time on, so ``hit`` answers which blocks it holds and ``insert_new`` takes blocks known to be new
without asking again. ``remove`` takes out blocks that leave the tier without being evicted (an exclusive
hierarchy's blocks moving up to the GPU, ``sim/tiers.py``). ``reserve`` gives slots to something that is not cached
content (swapped-out blocks, ``sim/tiers.py``): stored hashes are evicted to make room, and a reserved
slot is never evicted, only given back (``unreserve``). ``pin`` keeps stored hashes that a load in flight reads
from eviction until ``unpin`` (vLLM's ``CPUOffloadingManager``: ``prepare_load`` raises a block's ``ref_cnt``,
``complete_load`` lowers it, and only blocks at 0 are evictable); a pin is counted, as two loads may read one
block. A pinned block that ``remove`` takes out stays, ``leaving``, until its last pin goes: its host memory is
being read until then.

Invariants (``violations`` checks them): entries plus reserved slots at most ``capacity``, each hash held once,
every pinned hash stored, every leaving hash pinned; ARC's ghost lists hold no entry that is stored and at most
``capacity`` hashes each.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from itertools import filterfalse, islice


class TierStore(ABC):
    """The hashes one tier holds, at most ``capacity`` (> 0)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a tier holds at least one block, got capacity {capacity}")
        self.capacity = capacity
        self.num_reserved = 0  # slots held by swapped-out blocks: not content, never evicted
        self.num_evictions = 0
        self.pinned: dict[Hashable, int] = {}  # stored hash -> loads in flight reading it: never evicted
        self.leaving: set[Hashable] = set()  # pinned hashes removed: they go when their last pin does

    def __contains__(self, block_hash: Hashable) -> bool:
        return self.contains(block_hash)

    @abstractmethod
    def contains(self, block_hash: Hashable) -> bool:
        """Whether ``block_hash`` is stored (an attribute where a dict's own method answers: the hot call)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @property
    def num_kept_hashes(self) -> int:
        """Hashes the store keeps in memory: the stored ones (and ARC's ghosts): what its memory grows with."""
        return len(self)

    @abstractmethod
    def hashes(self) -> list[Hashable]:
        """Every stored hash (the invariant checks and the tests read it)."""

    @abstractmethod
    def insert(self, block_hashes: Sequence[Hashable]) -> list[Hashable]:
        """Store ``block_hashes`` in order (one already stored only counts as recently stored); returns the hashes
        evicted to make room."""

    def insert_new(self, block_hashes: Sequence[Hashable]) -> list[Hashable]:
        """``insert`` of hashes the caller knows are not stored, each named once."""
        return self.insert(block_hashes)

    def refresh(self, block_hashes: Sequence[Hashable]) -> None:
        """``insert`` of hashes the caller knows are stored (stored again: recently used); nothing is evicted."""
        self.insert(block_hashes)

    @abstractmethod
    def hit(self, block_hashes: Sequence[Hashable]) -> list[bool]:
        """A request reused those of ``block_hashes`` that are stored, in order (the last most recently); returns
        whether each is stored."""

    def remove(self, block_hashes: Sequence[Hashable]) -> None:
        """Take those of ``block_hashes`` that are stored out of the store: they left the tier (moved up), not
        evicted by its policy (neither counted as evictions nor remembered as ARC's ghosts); a pinned one once its
        last pin goes (``leaving``)."""
        pinned = self.pinned
        if pinned:
            self.leaving.update(filter(pinned.__contains__, block_hashes))
            block_hashes = list(filterfalse(pinned.__contains__, block_hashes))
        self._take_out(block_hashes)

    def keep(self, block_hashes: Sequence[Hashable]) -> None:
        """These hashes are stored again: those leaving stay."""
        if self.leaving:
            self.leaving.difference_update(block_hashes)

    @abstractmethod
    def _take_out(self, block_hashes: Sequence[Hashable]) -> None:
        """``remove`` of hashes none of which is pinned."""

    @abstractmethod
    def _evict_one(self) -> Hashable:
        """Take the entry the policy gives up first out of the store (counted); returns its hash."""

    @property
    def room(self) -> int:
        """Entries the store may hold beside the reserved slots."""
        return self.capacity - self.num_reserved

    def pin(self, block_hashes: Sequence[Hashable]) -> None:
        """A load in flight reads these stored hashes: none is evicted until ``unpin`` (precondition: each
        stored)."""
        pinned = self.pinned
        for block_hash in block_hashes:
            pinned[block_hash] = pinned.get(block_hash, 0) + 1

    def unpin(self, block_hashes: Sequence[Hashable]) -> None:
        """A load of these hashes has ended: a hash whose last pin this is may be evicted, or goes if leaving."""
        pinned, leaving, gone = self.pinned, self.leaving, []
        for block_hash in block_hashes:
            count = pinned[block_hash]
            if count > 1:
                pinned[block_hash] = count - 1
                continue
            del pinned[block_hash]
            if block_hash in leaving:
                leaving.discard(block_hash)
                gone.append(block_hash)
        if gone:
            self._take_out(gone)

    def can_reserve(self, num_slots: int) -> bool:
        """Whether ``num_slots`` more slots can be reserved: the blocks loads are reading cannot be evicted."""
        return self.num_reserved + num_slots + len(self.pinned) <= self.capacity

    def reserve(self, num_slots: int) -> list[Hashable]:
        """Hold ``num_slots`` slots for something else than cached content, evicting stored hashes to make room
        (precondition: ``can_reserve``); returns the hashes evicted."""
        if not self.can_reserve(num_slots):
            raise ValueError(f"cannot reserve {num_slots} slots: {self.num_reserved} of {self.capacity} reserved, "
                             f"{len(self.pinned)} held by loads")
        self.num_reserved += num_slots
        return [self._evict_one() for _ in range(len(self) - self.room)]

    def unreserve(self, num_slots: int) -> None:
        """Give back ``num_slots`` reserved slots."""
        if num_slots > self.num_reserved:
            raise ValueError(f"cannot give back {num_slots} slots: {self.num_reserved} reserved")
        self.num_reserved -= num_slots

    def violations(self) -> list[str]:
        hashes = self.hashes()
        found = []
        if len(hashes) + self.num_reserved > self.capacity:
            found.append(f"tier holds {len(hashes)} blocks and {self.num_reserved} reserved slots, over its capacity "
                         f"of {self.capacity}: eviction skipped")
        if len(set(hashes)) != len(hashes):
            found.append("a hash is stored twice in one tier: insert did not check for it")
        if not set(self.pinned) <= set(hashes):
            found.append("a pinned hash is not stored: a block a load reads was evicted or taken out")
        if not self.leaving <= set(self.pinned):
            found.append("a leaving hash is not pinned: its last pin went and it stayed")
        return found


class LRUStore(TierStore):
    """Least recently stored or reused goes first (vLLM's ``LRUCachePolicy``, LMCache's default)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._entries: OrderedDict[Hashable, None] = OrderedDict()  # least recently used first
        self.contains = self._entries.__contains__  # type: ignore[method-assign]

    def contains(self, block_hash: Hashable) -> bool:  # replaced by the dict's in __init__
        return block_hash in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def hashes(self) -> list[Hashable]:
        return list(self._entries)

    def insert(self, block_hashes: Sequence[Hashable]) -> list[Hashable]:
        entries, room = self._entries, self.room
        if room < 1:  # every slot reserved: nothing can be stored
            return []
        move, first = entries.move_to_end, self._first_unpinned
        evicted = []
        for block_hash in block_hashes:
            if block_hash in entries:
                move(block_hash)
                continue
            if len(entries) >= room:
                evicted.append(first())
                del entries[evicted[-1]]
            entries[block_hash] = None
        self.num_evictions += len(evicted)
        return evicted

    def insert_new(self, block_hashes: Sequence[Hashable]) -> list[Hashable]:
        entries, room = self._entries, self.room
        if room < 1:  # every slot reserved: nothing can be stored
            return []
        # Appending them all, then evicting the oldest, evicts what storing them one at a time would (the oldest
        # first, the new ones too when they outnumber the room). (Python loops of item assignments and dels: an
        # OrderedDict's update and a map over its __delitem__ go through generic slot wrappers, a third slower.)
        for block_hash in block_hashes:
            entries[block_hash] = None
        evicted = []
        if len(entries) > room:  # (the oldest, past those a load reads)
            oldest = filterfalse(self.pinned.__contains__, entries) if self.pinned else entries
            evicted = list(islice(oldest, len(entries) - room))
        for block_hash in evicted:
            del entries[block_hash]
        self.num_evictions += len(evicted)
        return evicted

    def refresh(self, block_hashes: Sequence[Hashable]) -> None:
        deque(map(self._entries.move_to_end, block_hashes), maxlen=0)

    def _take_out(self, block_hashes: Sequence[Hashable]) -> None:
        pop = self._entries.pop
        for block_hash in block_hashes:
            pop(block_hash, None)

    def hit(self, block_hashes: Sequence[Hashable]) -> list[bool]:
        # (a Python loop, each block moved right after its test: the move finds what the test just read in the
        # cache, which makes it faster than testing all the blocks and then moving the held ones in C)
        entries, move = self._entries, self._entries.move_to_end
        held = []
        for block_hash in block_hashes:
            found = block_hash in entries
            if found:
                move(block_hash)
            held.append(found)
        return held

    def _first_unpinned(self) -> Hashable:
        """The least recently used hash no load reads (precondition: there is one)."""
        if not self.pinned:
            return next(iter(self._entries))
        return next(filterfalse(self.pinned.__contains__, self._entries))

    def _evict_one(self) -> Hashable:
        self.num_evictions += 1
        block_hash = self._first_unpinned()
        del self._entries[block_hash]
        return block_hash


class ARCStore(TierStore):
    """Adaptive replacement (Megiddo and Modha, FAST'03), as vLLM's ``ARCCachePolicy``: blocks stored once wait
    in T1, blocks reused move to T2; eviction takes T1's oldest while T1 is at least its adaptive target, else
    T2's; an evicted hash is remembered in a ghost list (B1, B2), and storing it again moves the target towards
    the list it came from (a B1 hit: recency pays, T1 grows; a B2 hit: frequency pays, T1 shrinks)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.target_t1 = 0.0
        self.t1: OrderedDict[Hashable, None] = OrderedDict()  # stored, not reused since; oldest first
        self.t2: OrderedDict[Hashable, None] = OrderedDict()  # reused; least recently first
        self.b1: OrderedDict[Hashable, None] = OrderedDict()  # ghosts evicted from T1
        self.b2: OrderedDict[Hashable, None] = OrderedDict()  # ghosts evicted from T2

    def contains(self, block_hash: Hashable) -> bool:
        return block_hash in self.t1 or block_hash in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    @property
    def num_kept_hashes(self) -> int:
        return len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2)

    def hashes(self) -> list[Hashable]:
        return [*self.t1, *self.t2]

    def insert(self, block_hashes: Sequence[Hashable]) -> list[Hashable]:
        evicted: list[Hashable] = []
        if self.room < 1:  # every slot reserved: nothing can be stored
            return evicted
        for block_hash in block_hashes:
            if block_hash in self.t1:
                self.t1.move_to_end(block_hash)  # a store is not a reuse: it keeps its list
            elif block_hash in self.t2:
                self.t2.move_to_end(block_hash)
            else:
                self._adapt(block_hash)
                if len(self) >= self.room:
                    evicted.append(self._evict_one())
                self.t1[block_hash] = None
        return evicted

    def _adapt(self, block_hash: Hashable) -> None:
        """A ghost stored again moves T1's target towards the list it was evicted from."""
        if block_hash in self.b1:
            self.target_t1 = min(self.target_t1 + max(1.0, len(self.b2) / len(self.b1)), self.capacity)
            del self.b1[block_hash]
        elif block_hash in self.b2:
            self.target_t1 = max(self.target_t1 - max(1.0, len(self.b1) / len(self.b2)), 0.0)
            del self.b2[block_hash]

    def hit(self, block_hashes: Sequence[Hashable]) -> list[bool]:
        held = []
        for block_hash in block_hashes:
            if block_hash in self.t1:
                del self.t1[block_hash]
                self.t2[block_hash] = None
            elif block_hash in self.t2:
                self.t2.move_to_end(block_hash)
            else:
                held.append(False)
                continue
            held.append(True)
        return held

    def _take_out(self, block_hashes: Sequence[Hashable]) -> None:
        # (no ghost: the policy did not give the block up, so storing it again is no evidence for T1's target)
        for block_hash in block_hashes:
            self.t1.pop(block_hash, None)
            self.t2.pop(block_hash, None)

    def _evict_one(self) -> Hashable:
        # (the policy's list, past the blocks a load reads; the other list when every block in it is read, as
        # vLLM's ARCCachePolicy.evict)
        pinned = self.pinned.__contains__
        t1, t2 = next(filterfalse(pinned, self.t1), None), None
        if t1 is None or len(self.t1) < int(self.target_t1):  # (T2 scanned only when T1 does not give the victim)
            t2 = next(filterfalse(pinned, self.t2), None)
        source, ghosts, block_hash = (self.t1, self.b1, t1) if t2 is None else (self.t2, self.b2, t2)
        del source[block_hash]
        ghosts[block_hash] = None
        if len(ghosts) > self.capacity:
            ghosts.popitem(last=False)
        self.num_evictions += 1
        return block_hash

    def violations(self) -> list[str]:
        found = super().violations()
        stored = set(self.hashes())
        if stored & (set(self.b1) | set(self.b2)):
            found.append("an ARC ghost list names a stored hash: insert did not take it out")
        if len(self.b1) > self.capacity or len(self.b2) > self.capacity:
            found.append("an ARC ghost list outgrew the capacity: eviction did not trim it")
        return found


TIER_STORES: dict[str, type[TierStore]] = {"lru": LRUStore, "arc": ARCStore}
