"""A replica's KV events (vLLM's ``BlockStored`` / ``BlockRemoved``), published at the end of each step.

vLLM's engine emits the blocks its pool cached and evicted during a step when the step ends; a router that keeps an
index of them (llm-d's precise prefix scorer, Dynamo's KV router) sees each replica as of its last completed step.
A router matches a prompt's keys in one group (the first full-attention one), and what it sees of a step is the
step's net change, never the order of its events: ``KvEvents`` reads the pool's ``KeyLog`` of that group
(``memory/pool_events.py``: the keys cached and evicted, appended in C, with no event per call and no block lists)
and folds a step's keys into its index on ``publish``.

Invariant: after ``publish``, ``counts[h]`` is the number of the group's blocks cached under ``h`` (vLLM does not
de-duplicate identical content across blocks: an index counts blocks, not a set; no entry is ever 0).

``KvEvents`` keeps the keys counted once in a set, so that a step's keys fold in a few set operations (a fleet's
pools cache and evict millions of blocks, nearly every key once); ``CountedKvEvents``, a subscriber to the pool's
events, folds each event key by key into one count each: the reference it is tested against.

vLLM: vllm/v1/core/block_pool.py::BlockPool.take_events
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.pool_events import KeyLog


class KvEvents:
    """The index a router reads of one replica: its pool's key log, folded at each step's end.

    The published counts: ``ones`` holds the keys counted once, ``others`` every other key's count (twice or more:
    two blocks computed the same content; below 0 only where the pool evicted what it never told as cached); the
    two never share a key, and no count is 0.
    """

    def __init__(self, log: KeyLog | None = None) -> None:
        self.log = KeyLog() if log is None else log  # (the step's keys, until ``publish``)
        self.ones: set[Hashable] = set()
        self.others: dict[Hashable, int] = {}

    @classmethod
    def subscribed_to(cls, pool: BlockPool, group: int = 0) -> KvEvents:
        """A replica's KV events: the keys ``pool`` caches and evicts in ``group`` from now on."""
        return cls(pool.events.log_keys(group))

    @property
    def counts(self) -> dict[Hashable, int]:
        """The published count of every key cached (a copy)."""
        return {**dict.fromkeys(self.ones, 1), **self.others}

    def publish(self) -> None:
        """The step has ended: its keys reach the index, the removed ones first (counts add up: the order of a
        step's events does not change where they end). Each list usually removes keys that one block holds, or stores
        keys that no block holds, each once: two set operations over it (``_fold``); else a count per key."""
        log = self.log
        if not log.removed and not log.stored:  # (a router reads every replica for each request: mostly this)
            return
        for sign, keys in ((-1, log.removed), (1, log.stored)):
            if keys and not self._fold(sign, keys):
                ones, others = self.ones, self.others
                for key in keys:
                    self._count(key, (1 if key in ones else others.get(key, 0)) + sign)
        log.removed, log.stored = [], []

    def _fold(self, sign: int, keys: list[Hashable]) -> bool:
        """``keys`` removed (``sign`` -1) or stored (+1) as set operations, where each is a key counted once
        (removed) or not counted (stored), once in ``keys``: True. False where not, nothing changed."""
        ones, others = self.ones, self.others
        if others and not others.keys().isdisjoint(keys):
            return False
        size = len(ones)
        if sign < 0:
            if not ones.issuperset(keys):
                return False
            ones.difference_update(keys)
            if size - len(ones) == len(keys):
                return True
            ones.update(keys)  # (a key removed twice: undone, counted one by one)
            return False
        if not ones.isdisjoint(keys):
            return False
        ones.update(keys)
        if len(ones) - size == len(keys):
            return True
        ones.difference_update(keys)  # (a key stored twice)
        return False

    def _count(self, key: Hashable, count: int) -> None:
        self.ones.discard(key)
        self.others.pop(key, None)
        if count == 1:
            self.ones.add(key)
        elif count:
            self.others[key] = count

    def holds(self, key: Hashable) -> bool:
        """Whether the published index counts ``key``."""
        return key in self.ones or key in self.others

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


class CountedKvEvents:
    """The reference: a subscriber to the pool's events, each folded key by key into one count per key of its
    group (under several groups the events name a key (group, key); the index holds the bare key)."""

    def __init__(self, group: int | None = None) -> None:
        self.group = group  # (None: the events name bare keys)
        self.pending: list[tuple[int, list[Hashable]]] = []  # (+1 stored / -1 removed, keys) of this step
        self._counts: dict[Hashable, int] = {}

    @classmethod
    def subscribed_to(cls, pool: BlockPool, group: int = 0) -> CountedKvEvents:
        events = cls(group if pool.keys_by_group else None)
        pool.events.subscribe(events)
        return events

    def cached(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        self.pending.append((1, self._own(block_hashes)))

    def evicted(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        self.pending.append((-1, self._own(block_hashes)))

    def _own(self, block_hashes: Sequence[Hashable]) -> list[Hashable]:
        if self.group is None:
            return list(block_hashes)
        return [key for group, key in block_hashes if group == self.group]  # type: ignore[misc]

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

    def holds(self, key: Hashable) -> bool:
        return key in self._counts

    def matched_blocks(self, block_hashes: Sequence[Hashable]) -> int:
        counts = self._counts
        for matched, key in enumerate(block_hashes):
            if key not in counts:
                return matched
        return len(block_hashes)
