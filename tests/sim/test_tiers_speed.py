"""The tiers' fast paths keep the results: a flush that builds no (hash, block) pairs for a data plane stores what
one that builds them stores, and the LRU's hit moves the held blocks as a naive ordered list does."""

from __future__ import annotations

import random

import pytest

from minipaged_cli.memory.tier_store import LRUStore
from tests.sim.test_tiers import BLOCK_BYTES, HOST_LINK, host_tier


def test_a_flush_without_pairs_stores_what_one_with_them_does() -> None:
    """test_tiers' hand-worked timeline on a 6-block host tier (a-d, then e-f queued, g dropped, h evicting a),
    flushed without pairs: the same stores, drops and LRU order, and no pairs."""
    one = BLOCK_BYTES / HOST_LINK
    caches = [host_tier(6) for _ in range(2)]
    returned = []
    for tiers, pairs in zip(caches, (True, False), strict=True):
        got = []
        for hashes, blocks, now in ((["a", "b", "c", "d"], [0, 1, 2, 3], 0.0), (["e", "f"], [4, 5], 2 * one),
                                    (["g"], [6], 3 * one), (["h"], [7], 4.5 * one)):
            tiers.cached(hashes, blocks)
            got.append(tiers.flush(now, pairs=pairs))
        returned.append(got)
    assert returned[0] == [[("a", 0), ("b", 1), ("c", 2), ("d", 3)], [("e", 4), ("f", 5)], [], [("h", 7)]]
    assert returned[1] == [[], [], [], []]
    for tiers in caches:
        host = tiers.tiers[0]
        assert host.store.hashes() == ["b", "c", "d", "e", "f", "h"]  # LRU order: a out for h
        assert (host.stored_blocks, host.dropped_blocks) == (7, 1)
        assert host.write.busy_until == pytest.approx(7 * one)


def test_a_torn_report_is_refused() -> None:
    """The pool names a key per block: a report with fewer blocks than keys is a bug in the pool, not a store."""
    tiers = host_tier(6)
    with pytest.raises(ValueError, match="torn"):
        tiers.cached(["a", "b"], [0])


def test_lru_hit_moves_the_held_blocks_as_a_naive_list_does() -> None:
    """Random stores and hits (repeated blocks included) against a list kept least recently used first."""
    rng = random.Random(7)
    store, naive = LRUStore(12), []
    for _ in range(400):
        blocks = [rng.randrange(30) for _ in range(rng.randrange(1, 10))]
        if rng.random() < 0.5:
            new = list(dict.fromkeys(block for block in blocks if block not in naive))
            store.insert_new(new)
            naive += new
            del naive[:max(0, len(naive) - 12)]
        else:
            held = store.hit(blocks)
            assert held == [block in naive for block in blocks]
            for block in blocks:
                if block in naive:
                    naive.remove(block)
                    naive.append(block)
        assert store.hashes() == naive
