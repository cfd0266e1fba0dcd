"""A replica's KV events (vLLM's ``BlockStored`` / ``BlockRemoved``), published at the end of each step.

vLLM's engine emits the blocks its pool cached and evicted during a step when the step ends; a router that keeps an
index of them (llm-d's precise prefix scorer, Dynamo's KV router) sees each replica as of its last completed step.
``KvEvents`` subscribes to the pool's events (``memory/pool_events.py``, after the tiers below the GPU, which hear
each event first), gathers a step's events, and folds them into ``counts`` on ``publish``.

Invariant: after ``publish``, ``counts[h]`` is the number of the pool's blocks cached under ``h`` (vLLM does not
de-duplicate identical content across blocks: an index counts blocks, not a set; no entry is ever 0).

vLLM: vllm/v1/core/block_pool.py::BlockPool.take_events
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from minipaged_cli.memory.block_pool import BlockPool


class KvEvents:
    """A subscriber of the pool's events: a step's stored and removed blocks, pending until the step ends."""

    def __init__(self) -> None:
        self.counts: dict[Hashable, int] = {}
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

    def publish(self) -> None:
        """The step has ended: its events reach the index."""
        counts = self.counts
        for sign, keys in self.pending:
            for key in keys:
                left = counts.get(key, 0) + sign
                if left:
                    counts[key] = left
                else:
                    del counts[key]
        self.pending.clear()

    def matched_blocks(self, block_hashes: Sequence[Hashable]) -> int:
        """How many of ``block_hashes``, from the first, the published index holds (a prefix hit stops at the
        first miss)."""
        counts = self.counts
        for matched, key in enumerate(block_hashes):
            if key not in counts:
                return matched
        return len(block_hashes)
