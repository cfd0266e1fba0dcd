"""What a block pool tells those who subscribe to it: the blocks it caches and the cached blocks it evicts.

The subscribers are the tiers below the GPU (``sim/tiers.py``), which copy blocks down: each event reaches every
subscriber in subscription order, with its blocks. A fleet replica's KV events (``fleet/kv_events.py``), which a
router indexes as of a step's end, need neither the order nor the blocks: the pool appends the keys one group caches
and evicts to that group's ``KeyLog``, and the fast paths that cache in another order than single steps would
(``has_subscribers``) stay open to it.

vLLM: vllm/v1/core/block_pool.py::BlockPool.cache_full_blocks
vLLM: vllm/v1/core/block_pool.py::BlockPool._maybe_evict_cached_block
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from operator import itemgetter
from typing import Protocol


class PoolSubscriber(Protocol):
    """What a pool's subscriber is told. Keys are named as the pool names them: a content hash, or (group, hash)
    under KV cache groups (vLLM's ``BlockHashWithGroupId``); ``block_hashes[i]`` is ``blocks[i]``'s key."""

    def cached(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """These blocks now hold this content (the GPU computed or loaded it)."""

    def evicted(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """These cached blocks are about to be overwritten: their content leaves the GPU."""


class KeyLog:
    """The keys one group's map of a pool cached (``stored``) and evicted (``removed``) since its reader last took
    them, in bare keys (no group named), as two flat lists.

    What the reader may rely on: the keys each list gains between two reads are those of the events the pool would
    have sent its subscribers meanwhile (each ``cached`` key, each ``evicted`` key of this group), as many times
    each; their order is not kept."""

    def __init__(self, group: int = 0) -> None:
        self.group = group
        self.stored: list[Hashable] = []
        self.removed: list[Hashable] = []

    def cached(self, group: int, block_hashes: Sequence[Hashable]) -> None:
        """``group`` caches blocks under ``block_hashes``."""
        if group == self.group:
            self.stored += block_hashes

    def evicting(self, blocks: Sequence[int], block_hash: Sequence[Hashable | None],
                 block_group: Sequence[int] | None) -> None:
        """The pool is about to overwrite ``blocks``: the keys they carry (``block_hash``, per block) in this group
        (``block_group``, per block; None: the pool has one group)."""
        if block_group is None:
            if len(blocks) > 1:  # (the keys gathered in C; a block without one, None, is rare: then filtered)
                keys = itemgetter(*blocks)(block_hash)
                # (``all`` is a truth test in C: it also stops at a key 0, which the filter keeps)
                self.removed += keys if all(keys) else [key for key in keys if key is not None]
            elif blocks and (key := block_hash[blocks[0]]) is not None:
                self.removed.append(key)
        else:
            group = self.group
            self.removed += [key for block in blocks
                             if (key := block_hash[block]) is not None and block_group[block] == group]


class PoolEvents:
    """The subscribers of one pool, told each event in the order they subscribed, and at most one ``KeyLog``.

    The pool asks ``has_subscribers`` before it builds an event's lists: without subscribers nothing is built or
    sent (a replay without tiers caches and evicts millions of blocks); and ``log`` before it appends to a log."""

    def __init__(self) -> None:
        self.subscribers: list[PoolSubscriber] = []
        self.log: KeyLog | None = None

    def subscribe(self, subscriber: PoolSubscriber) -> None:
        """Tell ``subscriber`` every later event, after those who subscribed before it."""
        self.subscribers.append(subscriber)

    def log_keys(self, group: int = 0) -> KeyLog:
        """A log of the keys ``group`` caches and evicts from now on (one per pool: a replica's one index)."""
        if self.log is not None:
            raise ValueError("the pool already logs its keys for another reader: one KeyLog per pool")
        self.log = KeyLog(group)
        return self.log

    @property
    def has_subscribers(self) -> bool:
        """Whether anyone is told the pool's events in order (the windowed bulk decode, ``bulk.decode_in_bulk``, needs
        no one to be: it caches a bulk's blocks in another order than single steps would; a ``KeyLog`` does not
        count: it keeps no order)."""
        return bool(self.subscribers)

    def cached(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        for subscriber in self.subscribers:
            subscriber.cached(block_hashes, blocks)

    def evicted(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        for subscriber in self.subscribers:
            subscriber.evicted(block_hashes, blocks)
