"""A replica's KV events (vLLM's ``BlockStored`` / ``BlockRemoved``), published at the end of each step.

vLLM's engine emits the blocks its pool cached and evicted during a step when the step ends; a router that keeps an
index of them (llm-d's precise prefix scorer, Dynamo's KV router) sees each replica as of its last completed step.
``KvEvents`` subscribes to the pool's events (``memory/pool_events.py``, after the tiers below the GPU, which hear
each event first), gathers a step's events, and folds them into its index on ``publish``.

Invariant: after ``publish``, ``counts[h]`` is the number of the pool's blocks cached under ``h`` (vLLM does not
de-duplicate identical content across blocks: an index counts blocks, not a set; no entry is ever 0).

``KvEvents`` keeps the keys counted once in a set, so that a step's events fold in a few set operations (a fleet's
pools cache and evict millions of blocks, nearly every key once); ``CountedKvEvents`` folds them key by key into
one count each, the reference it is tested against.

vLLM: vllm/v1/core/block_pool.py::BlockPool.take_events
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

from minipaged_cli.memory.block_pool import BlockPool


class KvEvents:
    """A subscriber of the pool's events: a step's stored and removed blocks, pending until the step ends.

    The published counts: ``ones`` holds the keys counted once, ``others`` every other key's count (twice or more:
    two blocks computed the same content; below 0 only where the pool evicted what it never told as cached); the
    two never share a key, and no count is 0.
    """

    def __init__(self) -> None:
        self.ones: set[Hashable] = set()
        self.others: dict[Hashable, int] = {}
        self.pending: list[tuple[int, Sequence[Hashable]]] = []  # (+1 stored / -1 removed, keys) of this step

    @classmethod
    def subscribed_to(cls, pool: BlockPool) -> KvEvents:
        """A replica's KV events, told ``pool``'s events after those who subscribed before (the tiers)."""
        events = cls()
        pool.events.subscribe(events)
        return events

    def cached(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        self.pending.append((1, list(block_hashes)))

    def evicted(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        self.pending.append((-1, list(block_hashes)))

    @property
    def counts(self) -> dict[Hashable, int]:
        """The published count of every key cached (a copy)."""
        return {**dict.fromkeys(self.ones, 1), **self.others}

    def publish(self) -> None:
        """The step has ended: its events reach the index. The usual event stores keys no block holds, or removes
        keys one block holds, each once: one set operation; any other falls back to a count per key."""
        ones, others = self.ones, self.others
        for sign, keys in self.pending:
            if not others or others.keys().isdisjoint(keys):
                size = len(ones)
                if sign > 0 and ones.isdisjoint(keys):
                    ones.update(keys)
                    if len(ones) - size == len(keys):
                        continue
                    ones.difference_update(keys)  # (a key stored twice in one event: undone, counted below)
                elif sign < 0 and ones.issuperset(keys):
                    ones.difference_update(keys)
                    if size - len(ones) == len(keys):
                        continue
                    ones.update(keys)  # (a key removed twice in one event)
            for key in keys:
                self._count(key, (1 if key in ones else others.get(key, 0)) + sign)
        self.pending.clear()

    def _count(self, key: Hashable, count: int) -> None:
        self.ones.discard(key)
        self.others.pop(key, None)
        if count == 1:
            self.ones.add(key)
        elif count:
            self.others[key] = count

    def matched_blocks(self, block_hashes: Sequence[Hashable]) -> int:
        """How many of ``block_hashes``, from the first, the published index holds (a prefix hit stops at the
        first miss). The keys counted once are tested in C (``takewhile``) until the first that is not."""
        matched = len(list(itertools.takewhile(self.ones.__contains__, block_hashes)))
        others = self.others
        if others:
            for key in itertools.islice(block_hashes, matched, None):
                if key not in self.ones and key not in others:
                    break
                matched += 1
        return matched


class CountedKvEvents(KvEvents):
    """``KvEvents`` with one count per key, folded key by key (the reference)."""

    def __init__(self) -> None:
        super().__init__()
        self._counts: dict[Hashable, int] = {}

    @property
    def counts(self) -> dict[Hashable, int]:
        return self._counts

    def publish(self) -> None:
        counts = self._counts
        for sign, keys in self.pending:
            for key in keys:
                left = counts.get(key, 0) + sign
                if left:
                    counts[key] = left
                else:
                    del counts[key]
        self.pending.clear()

    def matched_blocks(self, block_hashes: Sequence[Hashable]) -> int:
        counts = self._counts
        for matched, key in enumerate(block_hashes):
            if key not in counts:
                return matched
        return len(block_hashes)
