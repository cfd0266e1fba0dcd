"""The block pool: the mechanism under the block manager (vLLM v1's ``BlockPool``).

It owns the physical blocks: their reference counts, the free queue, and the prefix cache's map from content hash
to the block holding that content. It decides nothing about sequences; the ``KVBlockManager`` (policy) asks it for
blocks, hands them back, and says which blocks now hold which content.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Iterator, Sequence


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """ceil(num_tokens / block_size): blocks a sequence of that length holds."""
    return -(-num_tokens // block_size)


class FreeBlockQueue:
    """The free blocks, in the order the pool hands them out.

    Blocks holding no cached content come first, oldest freed first; only when none is left does the pool evict a
    block that still holds cached content, the least recently freed first: an eviction never happens while an
    empty block waits, so no hit is lost for nothing. A cached free block can also leave from the middle, when a
    prefix-cache hit revives it. Invariant: each block is in at most one of the two parts.
    """

    def __init__(self, blocks: Iterable[int] = ()) -> None:
        self._empty: deque[int] = deque(blocks)  # no cached content
        self._cached: OrderedDict[int, None] = OrderedDict()  # an ordered set: least recently freed first

    def __len__(self) -> int:
        return len(self._empty) + len(self._cached)

    def __iter__(self) -> Iterator[int]:
        """In hand-out order."""
        return itertools.chain(self._empty, self._cached)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def append(self, blocks: Iterable[int], block_hash: Sequence[Hashable | None] | None = None) -> None:
        """Return freed blocks to the back of their part: the cached one when ``block_hash[block]`` is set."""
        if block_hash is None:
            self._empty.extend(blocks)
            return
        cached, empty = self._cached, self._empty
        for block in blocks:
            if block_hash[block] is None:
                empty.append(block)
            else:
                cached[block] = None  # (OrderedDict.update is several times slower than this loop)

    def take(self, count: int) -> tuple[list[int], int]:
        """The next ``count`` blocks (the caller has checked that there are enough), and how many of them, at
        the end of the list, come from the cached part: their content is evicted."""
        empty = self._empty
        from_empty = min(count, len(empty))
        taken = [empty.popleft() for _ in range(from_empty)]
        if from_empty < count:
            pop = self._cached.popitem
            taken.extend([pop(last=False)[0] for _ in range(count - from_empty)])
        return taken, count - from_empty

    def revive(self, block: int) -> None:
        """Take a cached block out of the queue: a prefix-cache hit holds it again."""
        del self._cached[block]

    def forget_cached(self) -> None:
        """The cached blocks lost their content: they join the empty ones, in their order."""
        self._empty.extend(self._cached)
        self._cached.clear()


class BlockPool:
    """``num_blocks`` physical blocks.

    Invariants (the block manager's checker verifies them against the block tables): a block is free exactly when
    its reference count is 0, and then sits once in ``free_blocks``, in the cached part exactly when it carries a
    hash; ``cached_blocks`` maps a hash to a block exactly when that block carries the hash
    (``block_hash[block]``); ``num_shared_references`` is Σ (ref_count - 1) over held blocks.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_blocks = FreeBlockQueue(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[Hashable | None] = [None] * num_blocks
        self.cached_blocks: dict[Hashable, int] = {}  # hash -> the block holding that content
        self.num_allocations = 0  # blocks taken from the free queue, ever
        self.num_frees = 0  # blocks returned to it, ever
        self.num_evictions = 0  # cached blocks whose hash was dropped because the pool handed them out again
        self.num_shared_references = 0  # table entries that cost no memory
        # (the looked-up hashes, hits) of the last lookup; None once the cache map changes
        self._lookup_memo: tuple[list[Hashable], list[int]] | None = None

    def take(self, count: int, table: list[int]) -> None:
        """Move ``count`` blocks from the front of the free queue to the end of ``table``, evicting their cached
        content (the caller has checked that there are enough). The article's ``allocate_block``."""
        refs, hashes = self.ref_counts, self.block_hash
        blocks, num_evicted = self.free_blocks.take(count)
        for block in blocks:
            refs[block] = 1
        table.extend(blocks)
        if num_evicted:
            for block in blocks[count - num_evicted:]:
                del self.cached_blocks[hashes[block]]
                hashes[block] = None
            self.num_evictions += num_evicted
            self._lookup_memo = None
        self.num_allocations += count

    def reference(self, block: int) -> None:
        """One more table holds ``block`` (a fork, a prefix-cache hit; a hit on a freed block revives it)."""
        if self.ref_counts[block]:
            self.num_shared_references += 1
        else:
            self.free_blocks.revive(block)
        self.ref_counts[block] += 1

    def drop_shared(self, block: int) -> None:
        """A table lets go of a block that others still hold (copy-on-write gave it a copy)."""
        self.ref_counts[block] -= 1
        self.num_shared_references -= 1

    def release(self, blocks: Sequence[int], keep_cached: bool) -> None:
        """A table lets go of ``blocks``, in the order a freed block should join the free queue; those no one
        else holds go back to it (``keep_cached``: with their cached content, revivable by a hit)."""
        refs = self.ref_counts
        freed = [block for block in blocks if refs[block] == 1]
        self.free_blocks.append(freed, self.block_hash if keep_cached else None)
        for block in blocks:
            refs[block] -= 1
        self.num_shared_references -= len(blocks) - len(freed)
        self.num_frees += len(freed)

    def lookup(self, block_hashes: list[Hashable]) -> list[int]:
        """The blocks holding the longest cached run of ``block_hashes`` from its start."""
        # The scheduler asks about the same waiting prompt several times a step; the answer only changes when the
        # cache does. The memo is keyed on the hashes' values, compared in C: far cheaper than the dictionary walk.
        memo = self._lookup_memo
        if memo is not None and memo[0] == block_hashes:
            return memo[1]
        hits = []
        get = self.cached_blocks.get
        for block_hash in block_hashes:
            block = get(block_hash)
            if block is None:
                break
            hits.append(block)
        self._lookup_memo = (block_hashes, hits)
        return hits

    def cache(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """``blocks[i]`` now holds the content ``block_hashes[i]`` names; the first block with some content keeps
        the entry. (One call for a run of blocks: a long prompt registers hundreds.)"""
        cached, hashes = self.cached_blocks, self.block_hash
        for block_hash, block in zip(block_hashes, blocks, strict=True):
            if block_hash not in cached and hashes[block] is None:
                cached[block_hash] = block
                hashes[block] = block_hash
                self._lookup_memo = None

    def reset_cache(self) -> bool:
        """Drop every cache entry; refuses (False, nothing changed) while a table holds a cached block."""
        if any(self.ref_counts[block] for block in self.cached_blocks.values()):
            return False
        for block in self.cached_blocks.values():
            self.block_hash[block] = None
        self.cached_blocks.clear()
        self.free_blocks.forget_cached()
        self._lookup_memo = None
        return True
