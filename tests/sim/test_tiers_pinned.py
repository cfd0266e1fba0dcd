"""A block a load in flight reads stays in its tier until the copy ends (vLLM 0.33.0's ``CPUOffloadingManager``:
``prepare_load`` raises the block's ``ref_cnt``, ``complete_load`` lowers it, only blocks at 0 are evictable).

The stores' pins against a naive LRU that skips pinned blocks, one block at a time; a hand-worked timeline of a
load's pins in the tiers' clock (a store that would evict a block being loaded is dropped or evicts the next
block); the pinned keys of a hybrid model's load; and ``run``'s data plane on the random traces where the tier
used to evict a block whose load was in flight (the load then failed, or copied another block's content).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.apps.offload_steps import StepOffload
from minipaged_cli.apps.run import _Executor
from minipaged_cli.dataplane.backends import TorchBackend
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.kv_groups import kv_cache_groups
from minipaged_cli.memory.tier_store import ARCStore, LRUStore
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import StepWork, replay
from minipaged_cli.sim.settings import TierSettings
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.sim.tiers import TieredCache
from tests.apps.test_offload_steps import MODEL, content
from tests.memory.test_tier_store import NaiveLRU
from tests.sim.test_tiers import BLOCK, BLOCK_BYTES, H200, HOST_LINK, QWEN3_8B, host_tier, random_trace
from tests.sim.test_tiers_hybrid import FULL, SLIDING, host_tier_holding

# -- the stores ------------------------------------------------------------------------------------------------


class NaivePinnedLRU(NaiveLRU):
    """test_tier_store_batches' naive LRU whose eviction takes the oldest block not pinned; a pinned block removed
    stays until its last pin goes."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.pins: dict[int, int] = {}
        self.leaving: set[int] = set()

    def _victim(self) -> int:
        return next(v for v in self.order if not self.pins.get(v))


operation = st.tuples(st.sampled_from(["insert", "insert_new", "hit", "pin", "unpin", "remove", "keep"]),
                      st.lists(st.integers(0, 12), max_size=6))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.lists(operation, max_size=50))
def test_lru_pins_match_a_naive_lru_that_skips_them(capacity: int, operations: list[tuple[str, list[int]]]) -> None:
    store, naive = LRUStore(capacity), NaivePinnedLRU(capacity)
    for name, hashes in operations:
        new = [h for h in dict.fromkeys(hashes) if h not in naive.order]
        if name in ("insert", "insert_new"):
            if len(naive.pins) >= capacity:  # (the tiers' drop rule stores nothing then: no block to evict)
                continue
            if name == "insert":
                assert store.insert(hashes) == naive.insert(hashes)
            else:
                assert store.insert_new(new) == naive.insert(new)
        elif name == "hit":
            assert store.hit(hashes) == naive.hit(hashes)
        elif name == "pin":  # its precondition: stored
            held = [h for h in hashes if h in naive.order]
            store.pin(held)
            for h in held:
                naive.pins[h] = naive.pins.get(h, 0) + 1
        elif name == "unpin":  # its precondition: each pinned (as often as named)
            ending = [h for h in hashes if h in naive.pins]
            ending = [h for i, h in enumerate(ending) if ending[:i + 1].count(h) <= naive.pins[h]]
            store.unpin(ending)
            for h in ending:
                naive.pins[h] -= 1
                if not naive.pins[h]:
                    del naive.pins[h]
                    if h in naive.leaving:
                        naive.leaving.discard(h)
                        naive.order.remove(h)
        elif name == "keep":
            store.keep(hashes)
            naive.leaving -= set(hashes)
        else:
            store.remove(hashes)
            naive.leaving |= {h for h in hashes if h in naive.pins}
            naive.order = [h for h in naive.order if h not in hashes or h in naive.pins]
        assert store.hashes() == naive.order and store.pinned == naive.pins and store.leaving == naive.leaving
        assert not store.violations()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.lists(operation, max_size=50))
def test_arc_never_evicts_a_pinned_block(capacity: int, operations: list[tuple[str, list[int]]]) -> None:
    store = ARCStore(capacity)
    for name, hashes in operations:
        if name in ("insert", "insert_new"):
            if len(store.pinned) >= capacity:
                continue
            pinned = set(store.pinned)
            new = [h for h in dict.fromkeys(hashes) if h not in store]
            evicted = store.insert(hashes) if name == "insert" else store.insert_new(new)
            assert not pinned & set(evicted)
        elif name == "hit":
            store.hit(hashes)
        elif name == "pin":
            store.pin([h for h in hashes if h in store])
        elif name == "unpin":
            store.unpin(list(dict.fromkeys(h for h in hashes if h in store.pinned)))
        elif name == "keep":
            store.keep(hashes)
        else:
            store.remove(hashes)
        assert not store.violations() and set(store.pinned) <= set(store.hashes())


def test_arc_evicts_the_policys_list_past_its_pinned_blocks() -> None:
    # T1 (stored once) a b c, T2 (reused) x y; T1's target 0: T1 gives up its oldest, a; with a pinned, b (not
    # T2's x); with all of T1 pinned, T2's oldest, x (vLLM's ARCCachePolicy.evict falls back to the other list).
    def arc() -> ARCStore:
        store = ARCStore(5)
        store.insert_new(["x", "y"])
        store.hit(["x", "y"])
        store.insert_new(["a", "b", "c"])
        assert (list(store.t1), list(store.t2), store.target_t1) == (["a", "b", "c"], ["x", "y"], 0.0)
        return store

    assert arc().insert_new(["d"]) == ["a"]
    store = arc()
    store.pin(["a"])
    assert store.insert_new(["d"]) == ["b"]
    store = arc()
    store.pin(["a", "b", "c"])
    assert store.insert_new(["d"]) == ["x"] and list(store.b2) == ["x"]


def test_a_pinned_block_removed_leaves_when_its_load_ends() -> None:
    # Exclusive tiers: the GPU caches a block a load still reads (its request resumed early under layerwise loads):
    # the block stays, not evictable, until the load's copy ends; a second load's pin on it outlives the first's.
    store = LRUStore(3)
    store.insert_new(["a", "b"])
    store.pin(["a"])
    store.remove(["a", "b"])
    assert store.hashes() == ["a"] and store.leaving == {"a"}
    store.pin(["a"])
    store.unpin(["a"])
    assert store.hashes() == ["a"] and store.pinned == {"a": 1}
    store.unpin(["a"])
    assert store.hashes() == [] and not store.leaving and not store.violations()
    # stored again before its load ended (the GPU gave it up): it stays
    store.insert_new(["c"])
    store.pin(["c"])
    store.remove(["c"])
    store.keep(["c"])
    store.unpin(["c"])
    assert store.hashes() == ["c"]


def test_a_reservation_leaves_the_pinned_blocks() -> None:
    store = LRUStore(4)
    store.insert_new(["a", "b", "c"])
    store.pin(["a"])
    assert not store.can_reserve(4)  # a is not evictable: 3 slots at most
    assert store.reserve(3) == ["b", "c"] and store.hashes() == ["a"]


# -- the tiers' clock ------------------------------------------------------------------------------------------


ONE = BLOCK_BYTES / HOST_LINK  # one block over the H200's host link: 47.3 us


def test_a_block_being_loaded_stays_until_its_copy_ends() -> None:
    """A host tier of 6 holds a-f. At t = 1 s a request loads a (one block: it ends at 1 s + ONE), and b-f are
    stored again (write-through: reused, no copy): a is the least recently used. A store of g while a's copy runs
    evicts b; one of h after it evicts a."""
    tiers = host_tier(6)
    store = tiers.tiers[0].store
    tiers.cached(list("abcdef"), list(range(6)))
    assert len(tiers.flush(0.0)) == 6
    assert tiers.load(["a", "x"], 0, 17, 1.0, True) == (16, pytest.approx(1.0 + ONE))
    tiers.cached(list("bcdef"), list(range(5)))
    assert tiers.flush(1.0) == []  # all stored: refreshed
    assert store.hashes() == list("abcdef") and store.pinned == {"a": 1}
    tiers.cached(["g"], [6])
    assert tiers.flush(1.0 + ONE / 2) == [("g", 6)]
    assert store.hashes() == list("acdefg")  # b, not a
    tiers.cached(["h"], [7])
    assert tiers.flush(1.0 + 2 * ONE) == [("h", 7)]  # the load ended: a goes
    assert store.hashes() == list("cdefgh") and store.pinned == {}


def test_a_block_both_written_and_read_counts_once_in_the_drop_rule() -> None:
    """A host tier of 4 stores a, b at 0 (copying until 2 x ONE); a request loads a at ONE / 2, before a's copy
    ends (the simulator lets it: the module docstring). At ONE, c and d fit beside a and b: 2 in flight, a read
    among them, 2 new: 4, not 5."""
    tiers = host_tier(4)
    tiers.cached(["a", "b"], [0, 1])
    tiers.flush(0.0)
    assert tiers.load(["a", "x"], 0, 17, ONE / 2, True)[0] == 16
    tiers.cached(["c", "d"], [2, 3])
    assert tiers.flush(ONE) == [("c", 2), ("d", 3)]
    assert tiers.tiers[0].dropped_blocks == 0 and len(tiers.tiers[0].store) == 4


def test_a_store_that_would_need_a_pinned_block_is_dropped() -> None:
    """A host tier of 4 holds a-d; a request loads all four (4 x ONE). A store of two blocks meanwhile has no
    block to evict (vLLM's prepare_store returns None: the store is skipped); after the load it evicts two."""
    tiers = host_tier(4)
    host = tiers.tiers[0]
    tiers.cached(list("abcd"), list(range(4)))
    tiers.flush(0.0)
    loaded, _ = tiers.load(list("abcdx"), 0, 65, 1.0, True)
    assert loaded == 64 and host.store.pinned == dict.fromkeys("abcd", 1)
    tiers.cached(["e", "f"], [4, 5])
    assert tiers.flush(1.0 + ONE) == [] and host.dropped_blocks == 2
    tiers.cached(["g", "h"], [6, 7])
    assert tiers.flush(1.0 + 4 * ONE) == [("g", 6), ("h", 7)]
    assert len(host.store) == 4 and host.store.num_evictions == 2


def test_a_hybrid_load_pins_the_pages_it_moves() -> None:
    # gpt-oss-20b (test_tiers_hybrid): a hit of 16 blocks moves the full group's 16 pages and the sliding group's
    # last 8; those 24 (group, hash) pages are pinned, the sliding group's first 8 are not.
    hashes = [f"h{i}" for i in range(17)]
    tiers = host_tier_holding([(g, h) for g in (FULL, SLIDING) for h in hashes[:16]])
    loaded, done = tiers.load(hashes, 0, 257, 0.0, True)
    assert loaded == 256
    assert set(tiers.tiers[0].store.pinned) == {(FULL, h) for h in hashes[:16]} | {(SLIDING, h) for h in hashes[8:16]}
    tiers.flush(done)
    assert tiers.tiers[0].store.pinned == {}


# -- run's data plane ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "inclusion", "seed", "num_blocks", "tier_blocks"), [
    # each of these failed before the pins: "not in the host pool", or a load copied another block's content
    ("on-eviction", "inclusive", 0, 20, 12), ("on-eviction", "exclusive", 5, 20, 12),
    ("on-eviction", "inclusive", 4, 12, 8), ("on-eviction", "exclusive", 7, 10, 6),
    ("write-through", "inclusive", 1, 12, 8), ("write-through", "inclusive", 3, 16, 5),
    ("write-through", "inclusive", 6, 10, 6),
    # and these loaded fewer blocks than the simulator counted (a load preempted before its step ran)
    ("on-eviction", "inclusive", 3, 16, 5), ("on-eviction", "exclusive", 0, 16, 5),
    # and these crashed before the host pool held a step's loads beside the tier's blocks
    ("on-eviction", "inclusive", 0, 10, 6), ("on-eviction", "exclusive", 0, 10, 6),
    ("on-eviction", "inclusive", 2, 12, 8), ("on-eviction", "exclusive", 2, 12, 8),
])
def test_every_load_copies_what_was_stored_under_its_hash(policy: str, inclusion: str, seed: int, num_blocks: int,
                                                           tier_blocks: int) -> None:
    # The reference: each stored block's content recorded when the store copies it (on-eviction: before the step
    # overwrites it; write-through: after the step computed it); every load must copy exactly that, and the data
    # plane must run every load the simulator's host tier counted.
    config_ = SimConfig.of(MODEL, H200, num_blocks=num_blocks, block_size=BLOCK, cpu_kv_blocks=tier_blocks,
                           offload_policy=policy, tier_inclusion=inclusion, max_model_len=512, check_invariants=True)
    cache = PagedKVCache(1, num_blocks, MODEL.num_kv_heads, BLOCK, MODEL.head_dim, torch.float32)
    backend = TorchBackend("cpu")
    offload = StepOffload.under(cache, backend, config_.tiers)
    executor = _Executor(cache, backend, MODEL.num_q_heads, seed=0, offload=offload)
    stored: dict[object, torch.Tensor] = {}
    loads: list[tuple[object, int]] = []

    def step(work: StepWork, allocator) -> None:
        if policy == "on-eviction":
            stored.update((h, content(cache, b)) for h, b in work.stores)
        executor(work, allocator)
        if policy == "write-through":
            stored.update((h, content(cache, b)) for h, b in work.stores)
        for block_hash, block in work.loads:
            assert torch.equal(content(cache, block), stored[block_hash]), block_hash
        loads.extend(work.loads)

    metrics = replay(random_trace(seed, 25, 0.01), config_, "paged", on_step=step)
    assert metrics.invariant_violations == 0
    assert offload.stats().loaded_blocks == len(loads) > 0
    assert metrics.tiers["cpu"].loaded_bytes == len(loads) * BLOCK * MODEL.kv_bytes_per_token
    assert metrics.tiers["cpu"].stored_bytes == offload.stats().stored_blocks * BLOCK * MODEL.kv_bytes_per_token
    assert offload.stats().host_blocks == tier_blocks


def test_a_block_leaving_the_disk_that_comes_back_down_stays_there() -> None:
    # Exclusive tiers, a host tier of 4 over a disk of 4 (a disk 4x the preset's read speed: the load of 64 tokens
    # beats recomputing them, test_tiers_exclusive). A request loads X1-X4 from the disk (pinned there); the GPU
    # caches them (they are leaving the disk) and, while the load's copy still runs, evicts them to the host tier,
    # whose next store (Y1-Y4) evicts them down again: the disk, which still holds them, keeps them, and no copy
    # is needed. Before, they were taken out of the disk when the load ended: in no tier at all.
    fast = H200.__class__(**{**H200.__dict__, "disk_read_bytes_per_s": 4 * 7.45e9})
    exclusive = TierSettings(cpu_kv_blocks=4, disk_kv_blocks=4, offload_policy="on-eviction",
                             tier_inclusion="exclusive")
    tiers = TieredCache(exclusive, BLOCK, kv_cache_groups(QWEN3_8B), BlockPool(10, enable_caching=True),
                        StepTimeModel(QWEN3_8B, fast))
    host, disk = tiers.tiers[0].store, tiers.tiers[1]
    xs, ys = ["X1", "X2", "X3", "X4"], ["Y1", "Y2", "Y3", "Y4"]
    disk.store.insert_new(xs)
    loaded, done = tiers.load([*xs, "x"], 0, 65, 1.0, True)
    assert loaded == 64 and done > 1.0 + 300e-6  # the disk's copy, then the host link's: 506 us
    tiers.cached(xs, [0, 1, 2, 3])
    assert disk.store.leaving == set(xs)
    tiers.evicted(xs, [0, 1, 2, 3])
    tiers.flush(1.0 + 1e-6)
    assert host.hashes() == xs
    tiers.evicted(ys, [4, 5, 6, 7])
    tiers.flush(1.0 + 300e-6)  # (X's copy to the host, 4 x 47 us, has ended)
    assert host.hashes() == ys and disk.store.leaving == set() and disk.stored_blocks == 0
    tiers.end_loads(done)
    assert sorted(disk.store.hashes()) == xs and not disk.store.pinned
