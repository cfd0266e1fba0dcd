"""The block pool: the mechanism under the block manager (vLLM's ``BlockPool``).

It owns the physical blocks: their reference counts, the one free queue, and a prefix cache per KV cache group
(a map from content hash to the blocks holding that content). It decides nothing about sequences; the
``KVBlockManager`` (policy) asks it for blocks, hands them back, and says which blocks now hold which content.

Under several groups vLLM keys the cache by ``BlockHashWithGroupId``: each group caches its own copy of a prefix.
Here each group has its own map, and a cached block records its group beside its key, so that caching, a lookup
and an eviction build no (group, key) object per block (on a pool of tens of thousands of blocks, allocating and
freeing those was most of the cache's cost). The pool's events, the tiers and ``keyed_cache`` name an entry (group,
key) under several groups (or a lone sliding one) and by its key alone under one full-attention group.

Ids are vLLM's shifted by one: vLLM's pool of N + 1 blocks reserves block 0 (its null block) and hands out 1..N in
the order this pool hands out 0..N-1.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Sequence

from minipaged_cli.memory import pool_loops
from minipaged_cli.memory.free_queue import FreeBlockQueue
from minipaged_cli.memory.pool_events import PoolEvents
from minipaged_cli.memory.pool_loops import PRIVATE


class BlockPool:
    """``num_blocks`` physical blocks; per-block state exists only for the ``num_touched`` ever handed out.

    Invariants (the block manager's checker verifies them against the block tables): a block is free exactly when
    its reference count is 0 (untouched blocks count 0), and then sits once in ``free_blocks``;
    ``cached_blocks[g]`` maps a hash to the block a hit of group g gets, the oldest of those carrying it
    (``block_hash[block]``, ``block_group[block]``), and ``duplicate_blocks[g]`` lists the younger ones (two
    sequences that computed the same content, as vLLM keeps them); ``num_shared_references`` is
    Σ (ref_count - 1) over held blocks.
    """

    def __init__(self, num_blocks: int, *, num_groups: int = 1, keys_by_group: bool | None = None,
                 enable_caching: bool = False) -> None:
        self.num_blocks = num_blocks
        self.num_groups = num_groups
        # Whether the pool's events and ``keyed_cache`` name an entry (group, key): by default under several groups
        self.keys_by_group = num_groups > 1 if keys_by_group is None else keys_by_group
        self.enable_caching = enable_caching
        self.free_blocks = FreeBlockQueue(num_blocks)
        self.ref_counts: list[int] = []  # per touched block
        self.block_hash: list[Hashable | None] = []  # per touched block: the content it is cached under
        self.block_group: list[int] = []  # per touched block: the group whose map caches it (where it has a hash)
        self.cached_blocks: list[dict[Hashable, int]] = [{} for _ in range(num_groups)]  # hash -> a hit's block
        # hash -> later blocks with that content, oldest first
        self.duplicate_blocks: list[dict[Hashable, list[int]]] = [{} for _ in range(num_groups)]
        self.num_allocations = 0  # blocks taken from the free queue, ever
        self.num_frees = 0  # blocks returned to it, ever
        self.num_evictions = 0  # cached blocks whose hash was dropped because the pool handed them out again
        self.num_shared_references = 0  # table entries that cost no memory
        self.cache_version = 0  # moves whenever a cache map changes (what a memo of hits is valid for)
        # Who is told what is cached and evicted (memory/pool_events.py): the tiers below the GPU, a fleet's router
        self.events = PoolEvents()
        self.loops = pool_loops.loops()  # the per-block loops: compiled where this machine builds them

    def take(self, count: int, table: list[int]) -> None:
        """Move ``count`` blocks from the front of the free queue to the end of ``table``, evicting their cached
        content (the caller has checked that there are enough). The article's ``allocate_block``. (One compiled call
        where the pool's loops are compiled and it is the usual case: ``pool_loops.take_into``.)"""
        if self.loops.take_into(self, count, table):
            return
        refs = self.ref_counts
        blocks, from_back = self.take_free(count)
        kept = count - from_back  # (from the front or never handed out: no hash; with prefix caching, none)
        if kept:
            self.loops.set_refs(refs, blocks[:kept], 1)
        if from_back:
            self._hold_evicting(blocks[kept:] if kept else blocks)
        table.extend(blocks)
        self.num_allocations += count

    def reference(self, *blocks: int) -> None:
        """One more table holds each of ``blocks`` (a fork; a prompt's hits, one call): a free one is revived."""
        revived, num_shared = self.loops.add_references(self.ref_counts, blocks)
        self.num_shared_references += num_shared
        if revived and not self.loops.remove_free(self.free_blocks, revived):
            self.free_blocks.remove(*revived)

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
        freed = self.unreference(tables)
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
        """``release`` of tables that the caller has split into their blocks carrying a key (``keyed``, a part per
        table) and those carrying none (``keyless``: a sequence's blocks past those it offered to the cache, which
        no other table holds), each part in eviction order: the same queue, with no test per block for a key.
        Freed keyed blocks go to the back in order; each keyless part to the front, ahead of the parts before it.
        (A replay releases hundreds of blocks a sequence, each tested twice by ``release``.)"""
        to_back = self.unreference(keyed)
        refs, num_freed = self.ref_counts, len(to_back)
        for part in keyless:
            self.loops.set_refs(refs, part, 0)
            self.free_blocks.prepend(part)
            num_freed += len(part)
        self.free_blocks.append(to_back)
        self.num_frees += num_freed

    def unreference(self, tables: Sequence[Sequence[int]]) -> Sequence[int]:
        """One table entry fewer for each of the ``tables``' blocks; those that no table holds any more, in order
        (their reference counts 0, still to be queued: the caller's ``release``). One pass frees the blocks held
        once up to the first shared one (a prompt's hits end its table's tail-first list); the rest are counted
        down. (A replay with prefix caching shares blocks in every release: counting each block down, then testing
        it, was two passes over millions of blocks.)"""
        blocks = tables[0] if len(tables) == 1 else list(itertools.chain.from_iterable(tables))
        refs = self.ref_counts
        first_shared = self.loops.free_unshared(refs, blocks)
        if first_shared == len(blocks):
            return blocks
        rest = blocks[first_shared:]
        for block in rest:
            refs[block] -= 1
        freed = [*blocks[:first_shared], *(block for block in rest if not refs[block])]
        self.num_shared_references -= len(blocks) - len(freed)
        return freed

    def lookup(self, block_hashes: Iterable[Hashable], group: int = 0) -> list[int]:
        """The blocks holding the longest cached run of ``block_hashes`` from its start, in ``group``'s map."""
        return self.loops.lookup(self.cached_blocks[group], block_hashes)

    def cache(self, block_hashes: Sequence[Hashable], blocks: Sequence[int], group: int = 0) -> None:
        """``blocks[i]`` now holds the content ``block_hashes[i]`` names, in ``group``. A block already cached keeps
        its hash; content already cached elsewhere is cached again (vLLM keeps block tables append-only rather
        than swap in the older copy), and hits keep going to the older block. (One call for a prompt's run.)"""
        self._tell(group, block_hashes, blocks)
        if self.num_groups > 1:  # (a block already cached is this group's: a table holds one group's blocks)
            groups = self.block_group
            for block in blocks:
                groups[block] = group
        self.cache_version += enter(self.cached_blocks[group], self.duplicate_blocks[group], self.block_hash,
                                    block_hashes, blocks)  # (its new entries, counted once)

    def cache_fresh(self, block_hashes: Sequence[Hashable], blocks: Sequence[int], group: int = 0) -> None:
        """``cache`` where the caller knows that no block carries a key (a table's blocks past those it offered to
        the cache, where no fork shares them): no test per block for one. (A replay with prefix caching runs this
        for every block that fills: one pass, each block's entry and key; one compiled call where the pool's loops are
        compiled and it is the usual case: ``pool_loops.cache_into``.)"""
        if self.loops.cache_into(self, block_hashes, blocks, group):
            return
        self._tell(group, block_hashes, blocks)
        if self.num_groups > 1:
            groups = self.block_group
            for block in blocks:
                groups[block] = group
        cached, duplicates, hashes = self.cached_blocks[group], self.duplicate_blocks[group], self.block_hash
        num_entries = len(cached)
        met = 0
        while (met := self.loops.enter_keys(hashes, cached, block_hashes, blocks, 0, met)) < len(block_hashes):
            duplicates.setdefault(block_hashes[met], []).append(blocks[met])  # (cached in the group already)
            met += 1
        if len(cached) != num_entries:
            self.cache_version += len(cached) - num_entries

    def name_private(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """Each of ``blocks`` that carries ``PRIVATE`` takes its key in ``block_hashes`` and the entry that
        ``cache`` gave it (one group): its sequence may ask for that content again. (No other block carries a
        private key: none is its entry already.)"""
        self.loops.name_private(self.block_hash, self.cached_blocks[0], block_hashes, blocks)
        self.cache_version += 1

    def reset_cache(self) -> bool:
        """Drop every cache entry; refuses (False, nothing changed) while a table holds a cached block. Free
        blocks keep their place in the queue, as in vLLM."""
        blocks = [block for cached, duplicates in zip(self.cached_blocks, self.duplicate_blocks, strict=True)
                  for block in itertools.chain(cached.values(), itertools.chain.from_iterable(duplicates.values()))]
        blocks += [block for block, key in enumerate(self.block_hash) if key is PRIVATE]  # (cached, in no map)
        if any(self.ref_counts[block] for block in blocks):
            return False
        for block in blocks:
            self.block_hash[block] = None
        for cached, duplicates in zip(self.cached_blocks, self.duplicate_blocks, strict=True):
            cached.clear()
            duplicates.clear()
        self.cache_version += 1
        return True

    @property
    def is_cached(self) -> Callable[[Hashable], bool]:
        """Whether a key (as the pool's events name it) is cached: the dict's own test under one group, for filters
        over a step's keys (the tiers')."""
        return self._is_cached if self.keys_by_group else self.cached_blocks[0].__contains__

    def _is_cached(self, pair: Hashable) -> bool:
        group, key = pair  # type: ignore[misc]
        return key in self.cached_blocks[group]

    def keyed_cache(self) -> tuple[dict[Hashable, int], dict[Hashable, list[int]], list[Hashable | None]]:
        """The cache map, the duplicates map and each touched block's key, keys as the pool's events name them (for
        the checker and tests: under several groups a copy, built per call)."""
        if not self.keys_by_group:
            return self.cached_blocks[0], self.duplicate_blocks[0], self.block_hash
        cached = {(g, key): block for g, blocks in enumerate(self.cached_blocks) for key, block in blocks.items()}
        duplicates = {(g, key): list(copies) for g, blocks in enumerate(self.duplicate_blocks)
                      for key, copies in blocks.items()}
        return cached, duplicates, [None if key is None else (g, key)
                                    for g, key in zip(self.block_group, self.block_hash, strict=True)]

    def _tell(self, group: int, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """Tell the subscribers what ``group`` caches (under several groups each key named (group, key), as vLLM's
        ``BlockHashWithGroupId``), and the key log its keys."""
        if self.events.has_subscribers:
            keys = [(group, key) for key in block_hashes] if self.keys_by_group else block_hashes
            self.events.cached(keys, blocks)
        if self.events.log is not None:
            self.events.log.cached(group, block_hashes)

    def take_free(self, count: int) -> tuple[list[int], int]:
        """The free queue's next ``count`` blocks and how many came from its back, with state for first-time ones."""
        blocks, from_back = self.free_blocks.take(count)
        first_seen = self.free_blocks.num_touched - len(self.ref_counts)
        if first_seen:
            self.ref_counts.extend(itertools.repeat(0, first_seen))
            self.block_hash.extend(itertools.repeat(None, first_seen))
            self.block_group.extend(itertools.repeat(0, first_seen))
        return blocks, from_back

    def _hold_evicting(self, blocks: list[int]) -> None:
        """Hold each of ``blocks`` once, and drop the cache entries of those that carry a hash: their content is about
        to be overwritten. The oldest duplicate of an evicted entry, if any, takes over its hits."""
        if self.events.has_subscribers:
            self.events.evicted(*self._cached_keys(blocks))
        if self.events.log is not None:
            self.events.log.evicting(blocks, self.block_hash, self.block_group if self.num_groups > 1 else None)
        evicted = self.drop_entries(blocks)
        if evicted:
            self.cache_version += 1
            self.num_evictions += evicted

    def _cached_keys(self, blocks: list[int]) -> tuple[list[Hashable], list[int]]:
        """The cached ``blocks``' keys and those blocks, for the pool's events (two lists: no pair per block)."""
        hashes, groups = self.block_hash, self.block_group
        if self.keys_by_group:
            cached = [block for block in blocks if hashes[block] is not None]
            return [(groups[block], hashes[block]) for block in cached], cached
        keys = [hashes[block] for block in blocks]
        if any(key is None for key in keys):  # (blocks freed uncached: rare in the queue's cached part)
            flags = [key is not None for key in keys]
            return list(itertools.compress(keys, flags)), list(itertools.compress(blocks, flags))
        return keys, blocks

    def drop_entries(self, blocks: list[int]) -> int:
        """Hold each of ``blocks`` once and drop its entry, if any (``_hold_evicting``); how many."""
        refs, maps, hashes, groups = self.ref_counts, self.cached_blocks, self.block_hash, self.block_group
        if any(self.duplicate_blocks):
            for block in blocks:
                refs[block] = 1
            cached_blocks = [block for block in blocks if hashes[block] is not None]
            for block in cached_blocks:
                group = groups[block]
                if hashes[block] is not PRIVATE:
                    drop_entry(maps[group], self.duplicate_blocks[group], hashes[block], block)
                hashes[block] = None
            return len(cached_blocks)
        if self.num_groups == 1:  # the usual case, and the hot loop of a replay with prefix caching: one block a hash
            return self.loops.hold_evicting(refs, hashes, maps[0], blocks)
        evicted = 0
        for block in blocks:
            refs[block] = 1
            block_hash = hashes[block]
            if block_hash is not None:
                if block_hash is not PRIVATE:
                    del maps[groups[block]][block_hash]
                hashes[block] = None
                evicted += 1
        return evicted


def enter(cached: dict[Hashable, int], duplicates: dict[Hashable, list[int]], block_hash: list[Hashable | None],
          keys: Sequence[Hashable], blocks: Sequence[int]) -> int:
    """``BlockPool.cache``'s entries into one map (``block_hash``: per block its key); how many are new."""
    num_entries = len(cached)
    add = cached.setdefault  # (one hash lookup where ``in`` then a store take two)
    for key, block in zip(keys, blocks, strict=True):
        if block_hash[block] is not None:
            continue
        block_hash[block] = key
        if key is not PRIVATE and add(key, block) != block:  # (cached elsewhere already: ``block`` carried no hash)
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
