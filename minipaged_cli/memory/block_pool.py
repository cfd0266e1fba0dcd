"""The block pool: the mechanism under the block manager (vLLM v1's ``BlockPool``).

It owns the physical blocks: their reference counts, the free queue, and the prefix cache's map from content hash
to the blocks holding that content. It decides nothing about sequences; the ``KVBlockManager`` (policy) asks it for
blocks, hands them back, and says which blocks now hold which content.

Ids are vLLM's shifted by one: vLLM's pool of N + 1 blocks reserves block 0 (its null block) and hands out 1..N in
the order this pool hands out 0..N-1.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence

from minipaged_cli.memory.free_queue import FreeBlockQueue
from minipaged_cli.memory.pool_events import PoolEvents


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """ceil(num_tokens / block_size): blocks a sequence of that length holds."""
    return -(-num_tokens // block_size)


class BlockPool:
    """``num_blocks`` physical blocks; per-block state exists only for the ``num_touched`` ever handed out.

    Invariants (the block manager's checker verifies them against the block tables): a block is free exactly when
    its reference count is 0 (untouched blocks count 0), and then sits once in ``free_blocks``; ``cached_blocks``
    maps a hash to the block a hit gets, the oldest of those carrying it (``block_hash[block]``), and
    ``duplicate_blocks`` lists the younger ones (two sequences that computed the same content, as vLLM keeps
    them); ``num_shared_references`` is Σ (ref_count - 1) over held blocks.
    """

    def __init__(self, num_blocks: int, *, enable_caching: bool = False) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.free_blocks = FreeBlockQueue(num_blocks)
        self.ref_counts: list[int] = []  # per touched block
        self.block_hash: list[Hashable | None] = []  # per touched block: the content it is cached under
        self.cached_blocks: dict[Hashable, int] = {}  # hash -> the block a hit gets
        self.duplicate_blocks: dict[Hashable, list[int]] = {}  # hash -> later blocks with that content, oldest first
        self.num_allocations = 0  # blocks taken from the free queue, ever
        self.num_frees = 0  # blocks returned to it, ever
        self.num_evictions = 0  # cached blocks whose hash was dropped because the pool handed them out again
        self.num_shared_references = 0  # table entries that cost no memory
        # (the looked-up hashes, hits) of the last lookup; None once the cache map changes
        self._lookup_memo: tuple[list[Hashable], list[int]] | None = None
        self.cache_version = 0  # moves whenever the cache map changes (what a memo of hits is valid for)
        # Who is told what is cached and evicted (memory/pool_events.py): the tiers below the GPU, a replica's KV
        # events.
        self.events = PoolEvents()

    def take(self, count: int, table: list[int]) -> None:
        """Move ``count`` blocks from the front of the free queue to the end of ``table``, evicting their cached
        content (the caller has checked that there are enough). The article's ``allocate_block``."""
        refs = self.ref_counts
        blocks, from_back = self.free_blocks.take(count)
        first_seen = self.free_blocks.num_touched - len(refs)
        if first_seen:
            self._touch(first_seen)
        for block in blocks:
            refs[block] = 1
        table.extend(blocks)
        if from_back:
            self._evict(blocks[count - from_back:])
        self.num_allocations += count

    def reference(self, block: int) -> None:
        """One more table holds ``block`` (a fork, a prefix-cache hit; a hit on a freed block revives it)."""
        if self.ref_counts[block]:
            self.num_shared_references += 1
        else:
            self.free_blocks.remove(block)
        self.ref_counts[block] += 1

    def drop_shared(self, block: int) -> None:
        """A table lets go of a block that others still hold (copy-on-write gave it a copy)."""
        self.ref_counts[block] -= 1
        self.num_shared_references -= 1

    def release(self, *tables: Sequence[int]) -> None:
        """Tables let go of their blocks, each table's given in eviction order (first evicted first), as one call
        per table in turn would (no block in two of them: a sequence's groups, one call for all); those no one else
        holds return to the free queue as vLLM's ``free_blocks`` returns them: with cached content to the back
        (their order kept), without to the front (their order kept, ahead of the blocks already there)."""
        refs, hashes = self.ref_counts, self.block_hash
        freed = self._unreference(tables)
        to_back = [block for block in freed if hashes[block] is not None] if self.enable_caching else []
        if len(to_back) < len(freed):  # (a window's blocks and a finished sequence's full ones all carry a hash)
            if len(tables) == 1:
                self.free_blocks.prepend([block for block in freed if hashes[block] is None] if to_back else freed)
            else:  # each table's ahead of the tables' before it, as one call each puts them
                for table in tables:
                    self.free_blocks.prepend([block for block in table if not refs[block] and hashes[block] is None])
        self.free_blocks.append(to_back)
        self.num_frees += len(freed)

    def release_split(self, keyed: Sequence[Sequence[int]], keyless: Sequence[Sequence[int]]) -> None:
        """``release`` of tables that the caller has split into their blocks carrying a key (``keyed``, a part
        per table) and those carrying none (``keyless``: a sequence's blocks past those it offered to the cache,
        which no other table holds), each part in eviction order: the same queue as ``release``, with no test per
        block for a key. Freed keyed blocks go to the back in order; each keyless part to the front, ahead of the
        parts before it."""
        to_back = self._unreference(keyed)
        refs, num_freed = self.ref_counts, len(to_back)
        for part in keyless:
            for block in part:
                refs[block] = 0
            self.free_blocks.prepend(part)
            num_freed += len(part)
        self.free_blocks.append(to_back)
        self.num_frees += num_freed

    def _unreference(self, tables: Sequence[Sequence[int]]) -> Sequence[int]:
        """One table entry fewer for each of the ``tables``' blocks; those that no table holds any more, in order."""
        blocks = tables[0] if len(tables) == 1 else list(itertools.chain.from_iterable(tables))
        refs = self.ref_counts
        if self.num_shared_references:
            for block in blocks:
                refs[block] -= 1
            freed = [block for block in blocks if not refs[block]]
            self.num_shared_references -= len(blocks) - len(freed)
            return freed
        for block in blocks:  # no block is shared: every one is freed (the usual case: no Python test per block)
            refs[block] = 0
        return blocks

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
        """``blocks[i]`` now holds the content ``block_hashes[i]`` names. A block already cached keeps its hash;
        content already cached elsewhere is cached again (vLLM keeps block tables append-only rather than swap in
        the older copy), and hits keep going to the older block. (One call for a run: a long prompt has hundreds.)"""
        if self.events.has_subscribers:
            self.events.cached(block_hashes, blocks)
        self._entered(enter(self.cached_blocks, self.duplicate_blocks, self.block_hash, block_hashes, blocks))

    def reset_cache(self) -> bool:
        """Drop every cache entry; refuses (False, nothing changed) while a table holds a cached block. Free
        blocks keep their place in the queue, as in vLLM."""
        maps = self._cache_maps()
        blocks = [block for cached, duplicates in maps for block in itertools.chain(
            cached.values(), itertools.chain.from_iterable(duplicates.values()))]
        if any(self.ref_counts[block] for block in blocks):
            return False
        for block in blocks:
            self.block_hash[block] = None
        for cached, duplicates in maps:
            cached.clear()
            duplicates.clear()
        self._lookup_memo = None
        self.cache_version += 1
        return True

    @property
    def is_cached(self) -> Callable[[Hashable], bool]:
        """Whether a key (as the pool's events name it) is cached: the dict's own test, for filters over a step's
        keys (the tiers')."""
        return self.cached_blocks.__contains__

    def keyed_cache(self) -> tuple[dict[Hashable, int], dict[Hashable, list[int]], list[Hashable | None]]:
        """The cache map, the duplicates map and each touched block's key, keys as the pool's events name them (for
        the checker and tests: under KV cache groups a copy, built per call)."""
        return self.cached_blocks, self.duplicate_blocks, self.block_hash

    def _touch(self, count: int) -> None:
        """State for ``count`` blocks handed out for the first time."""
        self.ref_counts.extend(itertools.repeat(0, count))
        self.block_hash.extend(itertools.repeat(None, count))

    def _cache_maps(self) -> list[tuple[dict[Hashable, int], dict[Hashable, list[int]]]]:
        """The (cached blocks, duplicate blocks) maps: one pair here."""
        return [(self.cached_blocks, self.duplicate_blocks)]

    def _entered(self, num_entries: int) -> None:
        """``num_entries`` new cache entries (counted once: a long prompt caches hundreds of blocks in one call)."""
        if num_entries:
            self._lookup_memo = None
            self.cache_version += num_entries

    def _evict(self, blocks: list[int]) -> None:
        """Drop the cache entries of those ``blocks`` that carry a hash: their content is about to be overwritten.
        The oldest duplicate of an evicted entry, if any, takes over its hits."""
        if self.events.has_subscribers:
            self.events.evicted(*self._cached_keys(blocks))
        evicted = self._drop_entries(blocks)
        if evicted:
            self._lookup_memo = None
            self.cache_version += 1
            self.num_evictions += evicted

    def _cached_keys(self, blocks: list[int]) -> tuple[list[Hashable], list[int]]:
        """The keys of those ``blocks`` that are cached, and those blocks, for the pool's events (two lists, no pair per
        block: a replay with tiers reports millions)."""
        hashes = self.block_hash
        keys = [hashes[block] for block in blocks]
        if any(key is None for key in keys):  # (blocks freed uncached: rare in the queue's cached part)
            cached = [key is not None for key in keys]
            return list(itertools.compress(keys, cached)), list(itertools.compress(blocks, cached))
        return keys, blocks

    def _drop_entries(self, blocks: list[int]) -> int:
        """``_evict``'s entries dropped; how many."""
        cached, duplicates, hashes = self.cached_blocks, self.duplicate_blocks, self.block_hash
        if duplicates:
            cached_blocks = [block for block in blocks if hashes[block] is not None]
            for block in cached_blocks:
                drop_entry(cached, duplicates, hashes[block], block)
                hashes[block] = None
            return len(cached_blocks)
        num_entries = len(cached)  # the usual case, and the hot loop of a replay with prefix caching: one block a hash
        for block in blocks:
            block_hash = hashes[block]
            if block_hash is not None:
                del cached[block_hash]
                hashes[block] = None
        return num_entries - len(cached)


def enter(cached: dict[Hashable, int], duplicates: dict[Hashable, list[int]], block_hash: list[Hashable | None],
          keys: Sequence[Hashable], blocks: Sequence[int]) -> int:
    """``BlockPool.cache``'s entries into one map (``block_hash``: per block its key); how many are new."""
    num_entries = len(cached)
    add = cached.setdefault  # (one hash lookup where ``in`` then a store take two)
    for key, block in zip(keys, blocks, strict=True):
        if block_hash[block] is not None:
            continue
        block_hash[block] = key
        if add(key, block) != block:  # (cached elsewhere already: ``block`` carried no hash)
            duplicates.setdefault(key, []).append(block)
    return len(cached) - num_entries


def drop_entry(cached: dict[Hashable, int], duplicates: dict[Hashable, list[int]], key: Hashable,
               block: int) -> None:
    """Drop ``block``'s entry under ``key`` where its content may be cached more than once: the oldest duplicate,
    if any, takes over its hits."""
    copies = duplicates.get(key)
    if copies is None:
        del cached[key]
        return
    if cached[key] == block:
        cached[key] = copies.pop(0)
    else:
        copies.remove(block)
    if not copies:
        del duplicates[key]
