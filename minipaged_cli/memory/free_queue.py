"""The free block queue: the order in which the block pool hands out its free blocks (vLLM's
``FreeKVCacheBlockQueue``), and so the prefix cache's eviction order. ``BlockPool`` (``block_pool.py``) owns one.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Iterator, Sequence


class FreeBlockQueue:
    """The free blocks, in the order the pool hands them out (vLLM's ``FreeKVCacheBlockQueue``).

    Allocation takes from the front. A freed block goes to the front when it holds no cached content (no hit can
    want it, and its memory was just used) and to the back when it does, so cached blocks are evicted least
    recently freed first, and only once no other free block is left; a prefix-cache hit takes a cached block out
    of the back part. Blocks never handed out are kept as a counter, not a list, so a pool costs memory only for
    the blocks it has used::

        front (prepended, last freed first) | untouched ids [num_touched, num_blocks) | back (appended, LRU)

    The back part is an append-only list read from ``_head``: appends and takes are list slices (C), not a
    Python step per block. A block a hit takes out stays in the list as a stale entry, skipped when reached:
    ``_stale[block]`` counts its stale entries, which all come before its live one (a block is free at most once
    at a time), so the first ``_stale[block]`` entries of ``block`` reached are the stale ones. The list is
    compacted when the entries passed or stale outnumber the live ones (memory stays linear in the blocks).

    Invariants: each free block is in exactly one part; a free block carrying a hash is in the back part; the back
    list from ``_head`` holds each block's stale entries, then its live entry where it is free there.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.num_touched = 0  # ids below it have been handed out at least once
        # len(self), kept as a count: the block manager asks at every allocation and admission check
        self.num_free = num_blocks
        self._front: deque[int] = deque()
        self._back: list[int] = []  # least recently freed first, from ``_head`` on
        self._head = 0
        self._stale: dict[int, int] = {}  # block -> its stale entries in the back list (hits are rare: a dict)
        self._num_stale = 0

    def __len__(self) -> int:
        return self.num_free

    def __iter__(self) -> Iterator[int]:
        """In hand-out order (every free block: O(num_blocks) on a fresh pool)."""
        return itertools.chain(self._front, range(self.num_touched, self.num_blocks), self._live_back())

    def touched(self) -> tuple[list[int], list[int]]:
        """The front and back parts: every free block that was handed out before."""
        return list(self._front), self._live_back()

    def prepend(self, blocks: Sequence[int]) -> None:
        """Put ``blocks`` at the front, ``blocks[0]`` first (vLLM's ``prepend_n``)."""
        self._front.extendleft(reversed(blocks))
        self.num_free += len(blocks)

    def append(self, blocks: Sequence[int]) -> None:
        """Put ``blocks`` at the back, ``blocks[-1]`` last (vLLM's ``append_n``)."""
        self._back += blocks
        self.num_free += len(blocks)

    def take(self, count: int) -> tuple[list[int], int]:
        """The next ``count`` blocks (the caller has checked that there are enough), and how many of them, at
        the end of the list, come from the back part: the ones that may hold cached content to evict."""
        # (the back part's walk would never end)
        assert count <= self.num_free, (f"took {count} of {self.num_free} free blocks: the caller's can_allocate "
                                        "check is broken")
        front = self._front
        if not front and self.num_touched == self.num_blocks:
            # (the steady state with prefix caching: every freed block is cached, the front stays empty)
            self.num_free -= count
            return self._take_back(count), count
        taken = [front.popleft() for _ in range(min(count, len(front)))] if front else []
        if len(taken) < count:
            start = self.num_touched
            self.num_touched = min(self.num_blocks, start + count - len(taken))
            taken.extend(range(start, self.num_touched))
        from_back = count - len(taken)
        if from_back:
            taken += self._take_back(from_back)
        self.num_free -= count
        return taken, from_back

    def remove(self, *blocks: int) -> None:
        """Take cached blocks out of the queue: prefix-cache hits hold them again (one call for a prompt's hits)."""
        stale = self._stale
        for block in blocks:
            stale[block] = stale.get(block, 0) + 1
        self._num_stale += len(blocks)
        self.num_free -= len(blocks)
        if self._num_stale > len(self._back) - self._head - self._num_stale:
            self._compact()

    def violations(self) -> list[str]:
        """The back list's bookkeeping against the invariants above, each broken one as a sentence naming the bug
        it points to (the block manager's checker adds them to its own)."""
        problems = []
        stale = self._stale
        if self._num_stale != sum(stale.values()):
            problems.append(f"the free queue counts {self._num_stale} stale entries but records "
                            f"{sum(stale.values())}: a hit counted in one place only")
        entries = Counter(itertools.islice(self._back, self._head, None))
        missing = sorted(block for block, skips in stale.items() if entries[block] < skips)
        if missing:
            problems.append(f"blocks {missing[:5]} were taken out of the free queue's back part more often than "
                            "they sit in it: a hit on a block that was not free there")
        live = self._live_back()
        if len(set(live)) != len(live):
            problems.append("a block sits twice in the free queue's back part: a double free")
        return problems

    def _take_back(self, count: int) -> list[int]:
        """The first ``count`` live entries of the back list, passed."""
        back, head, stale = self._back, self._head, self._stale
        taken = back[head:head + count]
        if stale and not stale.keys().isdisjoint(taken):  # (a hit took a block out: skip its stale entries)
            taken = self._take_back_skipping(count)
        else:
            self._passed(head + count)
        return taken

    def _take_back_skipping(self, count: int) -> list[int]:
        """``_take_back`` where stale entries lie among the next ones: chunk by chunk, each stale entry skipped."""
        back, head, stale = self._back, self._head, self._stale
        taken: list[int] = []
        while len(taken) < count:
            chunk = back[head:head + count - len(taken)]
            head += len(chunk)
            if not stale or stale.keys().isdisjoint(chunk):
                taken += chunk
                continue
            for block in chunk:
                skips = stale.get(block)
                if skips is None:
                    taken.append(block)
                    continue
                self._num_stale -= 1
                if skips == 1:
                    del stale[block]
                else:
                    stale[block] = skips - 1
        self._passed(head)
        return taken

    def _passed(self, head: int) -> None:
        """The back list's entries before ``head`` are passed; dropped once they outnumber the rest (their
        memmove of the live ones is then amortized O(1))."""
        self._head = head
        if head > len(self._back) - head:
            del self._back[:head]
            self._head = 0

    def _live_back(self) -> list[int]:
        """The back part's live entries, least recently freed first."""
        skips = dict(self._stale)
        live = []
        for block in itertools.islice(self._back, self._head, None):
            if skips.get(block):
                skips[block] -= 1
            else:
                live.append(block)
        return live

    def _compact(self) -> None:
        """Drop the passed and stale entries of the back list."""
        self._back = self._live_back()
        self._head = 0
        self._stale.clear()
        self._num_stale = 0
