"""The block pool under KV cache groups (``hybrid.py``): one pool of blocks, a prefix cache per group.

vLLM keys a hybrid pool's cache by ``BlockHashWithGroupId``: a hit is per group, and each group caches its own
copy of a prefix. Here each group has its own map from the content key to the block, and each cached block
records its group beside its key, so that caching, a lookup and an eviction build no (group, key) object per
block: on a pool of tens of thousands of blocks, allocating and freeing those was most of the cache's cost.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from minipaged_cli.memory.block_pool import BlockPool, drop_entry, enter


class GroupedBlockPool(BlockPool):
    """A ``BlockPool`` whose cache is keyed per group: ``cached_blocks[g]`` maps a key to the block a hit of group
    g gets, ``duplicate_blocks[g]`` lists the younger copies, and a cached block carries its key in ``block_hash``
    and its group in ``block_group`` (meaningless where it carries no key). The pool's events, the tiers' keys and
    ``keyed_cache`` name an entry (group, key), as vLLM's ``BlockHashWithGroupId``: built only for them. Hits are
    found in these maps by ``HybridBlockManager.find_hits`` (a hit needs every group): ``BlockPool.lookup``, one
    map's walk, does not apply.

    Invariants: ``BlockPool``'s, per group; ``cached_blocks[block_group[b]][block_hash[b]]`` is ``b`` or ``b`` is
    in that group's duplicates.
    """

    def __init__(self, num_blocks: int, num_groups: int, *, enable_caching: bool = False) -> None:
        super().__init__(num_blocks, enable_caching=enable_caching)
        self.cached_blocks: list[dict[Hashable, int]] = [{} for _ in range(num_groups)]  # type: ignore[assignment]
        self.duplicate_blocks: list[dict[Hashable, list[int]]] = [  # type: ignore[assignment]
            {} for _ in range(num_groups)]
        self.block_group: list[int] = []  # per touched block: the group whose map caches it

    def cache_group(self, group: int, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """``BlockPool.cache`` in one group's map."""
        self._mark(group, block_hashes, blocks)
        self._entered(enter(self.cached_blocks[group], self.duplicate_blocks[group], self.block_hash, block_hashes,
                            blocks))

    def cache_fresh_group(self, group: int, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """``cache_group`` where the caller knows that no block carries a key (a table's blocks past those offered
        to the cache, a bulk decode's freshly filled ones): no test per block for one, each block's entry, key and
        group in one pass."""
        self._tell(group, block_hashes, blocks)
        cached, duplicates, hashes, groups = (self.cached_blocks[group], self.duplicate_blocks[group],
                                              self.block_hash, self.block_group)
        num_entries = len(cached)
        add = cached.setdefault  # (one hash lookup where ``in`` then a store take two)
        for key, block in zip(block_hashes, blocks, strict=True):
            hashes[block] = key
            groups[block] = group
            if add(key, block) != block:  # (cached in the group already)
                duplicates.setdefault(key, []).append(block)
        self._entered(len(cached) - num_entries)

    def _mark(self, group: int, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """Tell the subscribers, and record ``blocks``' group (a block already cached is this group's: a table holds
        one group's blocks)."""
        self._tell(group, block_hashes, blocks)
        groups = self.block_group
        for block in blocks:
            groups[block] = group

    def _tell(self, group: int, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """Tell the subscribers what ``group`` caches, each key named (group, key), vLLM's ``BlockHashWithGroupId``."""
        if self.events.has_subscribers:
            self.events.cached([(group, key) for key in block_hashes], blocks)

    @property
    def is_cached(self) -> Callable[[Hashable], bool]:
        return self._is_cached

    def _is_cached(self, pair: Hashable) -> bool:
        group, key = pair  # type: ignore[misc]
        return key in self.cached_blocks[group]

    def keyed_cache(self) -> tuple[dict[Hashable, int], dict[Hashable, list[int]], list[Hashable | None]]:
        cached = {(g, key): block for g, blocks in enumerate(self.cached_blocks) for key, block in blocks.items()}
        duplicates = {(g, key): list(copies) for g, blocks in enumerate(self.duplicate_blocks)
                      for key, copies in blocks.items()}
        return cached, duplicates, [None if key is None else (g, key) for g, key in zip(self.block_group,
                                                                                        self.block_hash, strict=True)]

    def _touch(self, count: int) -> None:
        super()._touch(count)
        self.block_group.extend([0] * count)

    def _cache_maps(self) -> list[tuple[dict[Hashable, int], dict[Hashable, list[int]]]]:
        return list(zip(self.cached_blocks, self.duplicate_blocks, strict=True))

    def _cached_keys(self, blocks: list[int]) -> tuple[list[Hashable], list[int]]:
        hashes, groups = self.block_hash, self.block_group
        cached = [block for block in blocks if hashes[block] is not None]
        return [(groups[block], hashes[block]) for block in cached], cached

    def _drop_entries(self, blocks: list[int]) -> int:
        cached, hashes, groups = self.cached_blocks, self.block_hash, self.block_group
        if any(self.duplicate_blocks):
            cached_blocks = [block for block in blocks if hashes[block] is not None]
            for block in cached_blocks:
                group = groups[block]
                drop_entry(cached[group], self.duplicate_blocks[group], hashes[block], block)
                hashes[block] = None
            return len(cached_blocks)
        evicted = 0  # (the hot loop, as ``BlockPool``'s: one block a key)
        for block in blocks:
            key = hashes[block]
            if key is not None:
                del cached[groups[block]][key]
                hashes[block] = None
                evicted += 1
        return evicted
