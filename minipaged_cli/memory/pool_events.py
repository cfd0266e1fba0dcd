"""What a block pool tells those who subscribe to it: the blocks it caches and the cached blocks it evicts.

The subscribers are the tiers below the GPU (``sim/tiers.py``), which copy blocks down, and a fleet replica's KV
events (``fleet/kv_events.py``), which a router indexes. Each event reaches every subscriber in subscription order:
the tiers subscribe when their replay is built and a replica's KV events after them, so the tiers hear each event
first.

vLLM: vllm/v1/core/block_pool.py::BlockPool.cache_full_blocks
vLLM: vllm/v1/core/block_pool.py::BlockPool._maybe_evict_cached_block
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol


class PoolSubscriber(Protocol):
    """What a pool's subscriber is told. Keys are named as the pool names them: a content hash, or (group, hash)
    under KV cache groups (vLLM's ``BlockHashWithGroupId``); ``block_hashes[i]`` is ``blocks[i]``'s key."""

    def cached(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """These blocks now hold this content (the GPU computed or loaded it)."""

    def evicted(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """These cached blocks are about to be overwritten: their content leaves the GPU."""


class PoolEvents:
    """The subscribers of one pool, told each event in the order they subscribed.

    The pool asks ``has_subscribers`` before it builds an event's lists: without subscribers nothing is built or
    sent (a replay without tiers caches and evicts millions of blocks)."""

    def __init__(self) -> None:
        self.subscribers: list[PoolSubscriber] = []

    def subscribe(self, subscriber: PoolSubscriber) -> None:
        """Tell ``subscriber`` every later event, after those who subscribed before it."""
        self.subscribers.append(subscriber)

    @property
    def has_subscribers(self) -> bool:
        """Whether anyone is told the pool's events (the windowed bulk decode, ``bulk.decode_in_bulk``, needs no one
        to be: it caches a bulk's blocks in another order than single steps would)."""
        return bool(self.subscribers)

    def cached(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        for subscriber in self.subscribers:
            subscriber.cached(block_hashes, blocks)

    def evicted(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        for subscriber in self.subscribers:
            subscriber.evicted(block_hashes, blocks)
