"""The block pool's events (memory/pool_events.py): every subscriber told each event, in subscription order, with
the keys and blocks a hand-worked trace of the free queue gives; nothing built or sent without subscribers; a
fleet replica's tiers hear each event before its KV events, whose index counts what the pool holds cached."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import pytest

from minipaged_cli.fleet.replica import Replica
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request


class Logged:
    """A subscriber that writes each event, under its name, into a log shared with the others."""

    def __init__(self, name: str, log: list[tuple]) -> None:
        self.name, self.log = name, log

    def cached(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        self.log.append((self.name, "cached", list(block_hashes), list(blocks)))

    def evicted(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        self.log.append((self.name, "evicted", list(block_hashes), list(blocks)))


def cache_release_and_evict(pool: BlockPool) -> None:
    """Blocks 0 and 1 cached as "a" and "b", freed (to the queue's back: [2, 3, 0, 1]), then three taken: 2, 3 and
    0, whose content "a" is evicted."""
    table: list[int] = []
    pool.take(2, table)
    pool.cache(["a", "b"], table)
    pool.release(table)
    pool.take(3, [])


def test_two_subscribers_hear_every_event_in_subscription_order() -> None:
    log: list[tuple] = []
    pool = BlockPool(4, enable_caching=True)
    pool.events.subscribe(Logged("first", log))
    pool.events.subscribe(Logged("second", log))
    cache_release_and_evict(pool)
    assert log == [("first", "cached", ["a", "b"], [0, 1]), ("second", "cached", ["a", "b"], [0, 1]),
                   ("first", "evicted", ["a"], [0]), ("second", "evicted", ["a"], [0])]


def test_a_grouped_pool_names_each_key_with_its_group_to_every_subscriber() -> None:
    log: list[tuple] = []
    pool = BlockPool(4, num_groups=2, enable_caching=True)
    pool.events.subscribe(Logged("first", log))
    pool.events.subscribe(Logged("second", log))
    table: list[int] = []
    pool.take(2, table)
    pool.cache(["a", "b"], table, group=1)
    pool.release(table)
    pool.take(3, [])
    assert log == [("first", "cached", [(1, "a"), (1, "b")], [0, 1]),
                   ("second", "cached", [(1, "a"), (1, "b")], [0, 1]),
                   ("first", "evicted", [(1, "a")], [0]), ("second", "evicted", [(1, "a")], [0])]


def test_nothing_is_built_or_sent_without_subscribers(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = BlockPool(4, enable_caching=True)
    assert not pool.events.has_subscribers

    def no_event(*_: object) -> None:
        raise AssertionError("an event was built for no one")

    monkeypatch.setattr(pool, "_cached_keys", no_event)  # (the evicted event's lists)
    monkeypatch.setattr(pool.events, "cached", no_event)
    monkeypatch.setattr(pool.events, "evicted", no_event)
    cache_release_and_evict(pool)
    assert pool.num_evictions == 1  # (the trace did evict: the event had something to say)


def test_a_late_subscriber_hears_only_what_follows() -> None:
    log: list[tuple] = []
    pool = BlockPool(4, enable_caching=True)
    table: list[int] = []
    pool.take(2, table)
    pool.cache(["a", "b"], table)
    pool.events.subscribe(Logged("late", log))
    assert pool.events.has_subscribers
    pool.release(table)
    pool.take(3, [])
    assert log == [("late", "evicted", ["a"], [0])]


def test_a_replica_with_tiers_tells_the_tiers_first_and_its_index_counts_the_pools_cached_blocks() -> None:
    # Four requests sharing a 64-token prefix on a pool of 12 blocks of 16 with a host tier of 8: the pool caches
    # and evicts, the tiers store, and after the last step the published index counts what the pool holds cached
    # (fleet/kv_events.py's invariant), counted here from the pool's own map.
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=12, block_size=16, cpu_kv_blocks=8,
                       max_model_len=512)
    replica = Replica(0, config, {"sys": 64}, 4, kv_events=True)
    pool = replica.replay.allocator.manager.pool
    assert pool.events.subscribers == [replica.replay.tiers, replica.events]
    for index in range(4):
        replica.send(Request(str(index), 0.5 * index, 100 + 16 * index, 20, prefix=("sys",)), index, 0.5 * index)
    while replica.has_work:
        replica.iterate(None)
        replica.take_done()  # (as the fleet does: what finished or was refused reaches its clients)
    replica.events.publish()
    cached, duplicates, _ = pool.keyed_cache()
    held = Counter(cached.keys()) + Counter({key: len(copies) for key, copies in duplicates.items()})
    assert replica.events.counts == dict(held) and held
    assert replica.replay.tiers.tiers[0].stored_blocks > 0  # (the tiers heard the events too)
