"""The block pool's events (memory/pool_events.py): every subscriber told each event, in subscription order, with
the keys and blocks a hand-worked trace of the free queue gives; nothing built or sent without subscribers; a key
log gains the keys of the events a subscriber is told, as many times each, on random pools under one and several
groups; a fleet replica's tiers hear each event, and its KV events' index counts what the pool holds cached."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_a_key_log_hears_its_groups_keys_of_the_hand_worked_trace() -> None:
    pool = BlockPool(4, num_groups=2, enable_caching=True)
    log = pool.events.log_keys(group=1)
    assert not pool.events.has_subscribers  # (a log keeps no order: the fast paths stay open)
    table: list[int] = []
    pool.take(2, table)
    pool.cache(["a"], table[:1], group=0)
    pool.cache(["b"], table[1:], group=1)
    pool.release(table)
    pool.take(4, [])  # (evicts both: only group 1's key is logged, bare)
    assert (log.stored, log.removed) == (["b"], ["b"])
    with pytest.raises(ValueError, match="one KeyLog per pool"):
        pool.events.log_keys()


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2]))
def test_a_key_log_gains_the_keys_of_the_events_a_subscriber_hears(seed: int, num_groups: int) -> None:
    # Two pools driven alike: one tells a subscriber each event, the other only logs keys; taken, cached (``cache``
    # and ``cache_fresh``), released and evicted blocks, keys from a small alphabet (repeats: duplicates)
    rng = random.Random(seed)
    num_blocks = rng.randint(4, 24)
    told, logged = (BlockPool(num_blocks, num_groups=num_groups, enable_caching=True) for _ in range(2))
    events: list[tuple] = []
    told.events.subscribe(Logged("told", events))
    group = rng.randrange(num_groups)
    log = logged.events.log_keys(group)
    tables: list[list[int]] = []
    for _ in range(rng.randint(1, 30)):
        if tables and rng.random() < 0.3:
            table = tables.pop(rng.randrange(len(tables)))
            for pool in (told, logged):
                pool.release(table[::-1])
            continue
        count = rng.randint(1, 4)
        if count > told.free_blocks.num_free:
            continue
        table, same = [], []
        told.take(count, table)
        logged.take(count, same)
        assert same == table
        cached_group = rng.randrange(num_groups)
        keys = [rng.randrange(12) for _ in table]
        cache = "cache" if rng.random() < 0.5 else "cache_fresh"
        for pool in (told, logged):
            getattr(pool, cache)(keys, table, cached_group)
        tables.append(table)
    assert logged.keyed_cache() == told.keyed_cache()

    def own(key: Hashable) -> Hashable | None:  # (the told key, as the log names it: its group's keys, bare)
        if num_groups == 1:
            return key
        key_group, bare = key  # type: ignore[misc]
        return bare if key_group == group else None

    for kind, logged_keys in (("cached", log.stored), ("evicted", log.removed)):
        told_keys = [own(key) for _, name, keys, _ in events if name == kind for key in keys]
        assert Counter(logged_keys) == Counter(key for key in told_keys if key is not None)


def test_a_replica_with_tiers_tells_the_tiers_and_its_index_counts_the_pools_cached_blocks() -> None:
    # Four requests sharing a 64-token prefix on a pool of 12 blocks of 16 with a host tier of 8: the pool caches
    # and evicts, the tiers store, and after the last step the published index counts what the pool holds cached
    # (fleet/kv_events.py's invariant), counted here from the pool's own map.
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=12, block_size=16, cpu_kv_blocks=8,
                       max_model_len=512)
    replica = Replica(0, config, {"sys": 64}, 4, kv_events=True)
    pool = replica.replay.allocator.manager.pool
    assert pool.events.subscribers == [replica.replay.tiers] and pool.events.log is replica.events.log
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
