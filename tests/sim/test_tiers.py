"""The prefix cache's tiers below the GPU (sim/tiers.py, memory/tier_store.py): hand-worked traces, the link's
clock, invariants under random traces, and agreement with a naive LRU over the same requests."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.kv_groups import kv_cache_groups
from minipaged_cli.memory.prefix import block_content_keys
from minipaged_cli.memory.tier_store import ARCStore, LRUStore
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay, StepWork, replay, simulate
from minipaged_cli.sim.settings import TierSettings
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.sim.tiers import TieredCache
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request, make_trace

QWEN3_8B = load_model("qwen3-8b")  # 147,456 B of KV per token (36 layers x 8 KV heads x 128 x 2 x 2 B)
H200 = load_gpu("h200")
BLOCK = 16
BLOCK_BYTES = BLOCK * 147_456  # 2,359,296 B
HOST_LINK = 64e9 * 0.78  # the H200 preset's PCIe Gen5 x16 at the achieved share: 49.92 GB/s


def three_requests() -> tuple:
    """A (64-token system prompt + 1 token), then B (another 64 + 1), then A's prompt again, 10 s apart, one
    output token each: on a GPU pool of 5 blocks, B's allocation evicts A's four cached blocks."""
    requests = [Request("a", 0.0, 65, 1, prefix=("sys",)), Request("b", 10.0, 65, 1, prefix=("other",)),
                Request("c", 20.0, 65, 1, prefix=("sys",))]
    return make_trace("three", requests, source="test", segments={"sys": 64, "other": 64})


def config(**tiers: object) -> SimConfig:
    return SimConfig.of(QWEN3_8B, H200, num_blocks=5, block_size=BLOCK, **tiers)


def host_tier(cpu_kv_blocks: int) -> TieredCache:
    """A host tier of ``cpu_kv_blocks`` blocks of BLOCK tokens under a 10-block pool: Qwen3-8B on the H200."""
    return TieredCache(TierSettings(cpu_kv_blocks=cpu_kv_blocks), BLOCK, kv_cache_groups(QWEN3_8B),
                       BlockPool(10, enable_caching=True), StepTimeModel(QWEN3_8B, H200))


def prefill_seconds(model: StepTimeModel, tokens: int, context: int) -> float:
    """One step prefilling ``tokens`` after ``context`` cached tokens (the step-time model, tested elsewhere)."""
    return float(model.step_seconds(new_tokens=tokens, sequences=1, prefill_tokens=tokens,
                                    prefill_attended=tokens * context + tokens * (tokens + 1) / 2,
                                    prefill_context=context + tokens))


def test_a_host_hit_loads_what_the_gpu_evicted() -> None:
    trace = three_requests()
    with_tiers = replay(trace, config(cpu_kv_blocks=8), "paged")
    without = replay(trace, config(), "paged")
    model = StepTimeModel(QWEN3_8B, H200)
    whole, rest = prefill_seconds(model, 65, 0), prefill_seconds(model, 1, 64)
    # Without tiers every request prefills all 65 tokens: B evicted A's blocks before C came.
    assert without.prefix_cache_hits == 0
    assert without.mean_ttft_s == pytest.approx(whole)
    # With a host tier of 8 blocks, A's and B's 4 full blocks each were stored after their prefill; C finds A's 4
    # there and loads them: 4 x 2,359,296 B over 49.92 GB/s = 189.0 us, then prefills its last token.
    load_s = 4 * BLOCK_BYTES / HOST_LINK
    assert load_s == pytest.approx(189.05e-6, rel=1e-4)
    cpu = with_tiers.tiers["cpu"]
    assert (cpu.hit_tokens, cpu.loaded_bytes, cpu.stored_bytes) == (64, 4 * BLOCK_BYTES, 8 * BLOCK_BYTES)
    assert cpu.hit_pct == pytest.approx(100 * 64 / 195)
    assert cpu.evictions == 0 and cpu.dropped_stores == 0
    assert with_tiers.mean_ttft_s == pytest.approx((2 * whole + load_s + rest) / 3)
    # GPU evictions: B's allocation takes A's 4 cached blocks, C's takes B's 4.
    assert with_tiers.num_evictions == 8


def test_layerwise_loads_overlap_the_prefill() -> None:
    # Layer by layer, C's one-token prefill starts once only the layers it would outrun are still in flight: it
    # waits for the load less the prefill's own GPU time (its compute beyond what any step costs), at least one
    # layer's share (36 layers).
    model = StepTimeModel(QWEN3_8B, H200)
    whole, rest = prefill_seconds(model, 65, 0), prefill_seconds(model, 1, 64)
    own = rest - float(model.step_seconds(new_tokens=0, sequences=0))
    load_s = 4 * BLOCK_BYTES / HOST_LINK
    metrics = replay(three_requests(), config(cpu_kv_blocks=8, layerwise_loads=True), "paged")
    assert metrics.mean_ttft_s == pytest.approx((2 * whole + max(load_s / 36, load_s - own) + rest) / 3)
    assert 0 < own < load_s


def test_a_full_host_tier_evicts_least_recently_stored() -> None:
    # 4 blocks: B's store evicts A's 4, so C finds nothing below the GPU either; C's 4 computed blocks are
    # stored once more, evicting B's.
    metrics = replay(three_requests(), config(cpu_kv_blocks=4), "paged")
    cpu = metrics.tiers["cpu"]
    assert (cpu.evictions, cpu.hit_tokens, cpu.loaded_bytes) == (8, 0, 0)
    assert cpu.stored_bytes == 12 * BLOCK_BYTES


def test_recompute_beats_a_slow_link() -> None:
    # At 1 MB/s the 9.4 MB load takes 9.4 s, far longer than prefilling 64 tokens: C recomputes them.
    slow = dataclasses.replace(H200, host_bandwidth_bytes_per_s=1e6, host_bandwidth_efficiency=1.0)
    metrics = replay(three_requests(), SimConfig.of(QWEN3_8B, slow, num_blocks=5, block_size=BLOCK, cpu_kv_blocks=8),
                     "paged")
    cpu = metrics.tiers["cpu"]
    assert (cpu.hit_tokens, cpu.recomputed_tokens, cpu.loaded_bytes) == (0, 64, 0)


def test_on_eviction_stores_what_the_gpu_evicts() -> None:
    # On-eviction: A's 4 blocks go down when B's allocation evicts them, B's when C's does; C loads A's.
    metrics = replay(three_requests(), config(cpu_kv_blocks=8, offload_policy="on-eviction"), "paged")
    cpu = metrics.tiers["cpu"]
    assert (cpu.hit_tokens, cpu.stored_bytes, cpu.loaded_bytes) == (64, 8 * BLOCK_BYTES, 4 * BLOCK_BYTES)


def test_disk_loads_cross_both_links() -> None:
    # A host tier of 4 blocks loses A's blocks to B's; the 8-block disk under it (write-through) keeps them. At
    # the preset's 7.45 GB/s the disk would take 1.27 ms (+ 0.19 ms over the host link), slower than the H200
    # prefilling 64 tokens: C recomputes. On a disk array 4x faster it loads.
    disk = replay(three_requests(), config(cpu_kv_blocks=4, disk_kv_blocks=8), "paged").tiers["disk"]
    assert (disk.hit_tokens, disk.recomputed_tokens, disk.stored_bytes) == (0, 64, 8 * BLOCK_BYTES)
    model = StepTimeModel(QWEN3_8B, H200)
    assert prefill_seconds(model, 65, 0) \
        - prefill_seconds(model, 1, 64) < 4 * BLOCK_BYTES / 7.45e9 + 4 * BLOCK_BYTES / HOST_LINK

    fast = dataclasses.replace(H200, disk_read_bytes_per_s=4 * 7.45e9)
    cfg = SimConfig.of(QWEN3_8B, fast, num_blocks=5, block_size=BLOCK, cpu_kv_blocks=4, disk_kv_blocks=8)
    steps: list[StepWork] = []
    metrics = Replay(three_requests(), cfg, cfg.allocator("paged"), False, None,
                     lambda work, _: steps.append(work)).run()
    disk = metrics.tiers["disk"]
    assert (disk.hit_tokens, disk.loaded_bytes, disk.stored_bytes) == (64, 4 * BLOCK_BYTES, 8 * BLOCK_BYTES)
    load_s = 4 * BLOCK_BYTES / (4 * 7.45e9) + 4 * BLOCK_BYTES / HOST_LINK  # disk -> host, then host -> GPU
    assert metrics.mean_ttft_s == pytest.approx((2 * prefill_seconds(model, 65, 0) + load_s
                                                 + prefill_seconds(model, 1, 64)) / 3)
    # The data plane's view: A's and B's blocks copied down after their steps; C's load starts in a step that
    # computes nothing (C waits for it), and once C computes, its loaded blocks (the host tier lost them) are
    # copied to the host tier after its step.
    sys_keys = block_content_keys([("sys", 64), (("prompt", 2), 1), (("output", 2, 0), 1)], BLOCK)
    assert [(len(s.stores), len(s.loads), bool(s.prefills)) for s in steps] == [(4, 0, True), (4, 0, True),
                                                                                (0, 4, False), (4, 0, True)]
    assert [h for h, _ in steps[2].loads] == sys_keys[:4] == [h for h, _ in steps[0].stores]
    assert steps[3].stores == steps[2].loads


def test_stores_queue_on_the_link_and_drop_only_past_the_tiers_room() -> None:
    """A hand-worked timeline on a host tier of 6 blocks, times in one block's copy (47.3 us): stores queue behind
    the copies in flight; a store is dropped only when it and the blocks still being written exceed the 6 slots
    (vLLM's prepare_store: chunks being written are not evictable)."""
    tiers = host_tier(6)
    one = BLOCK_BYTES / HOST_LINK
    host = tiers.tiers[0]
    tiers.cached(["a", "b", "c", "d"], [0, 1, 2, 3])
    assert len(tiers.flush(0.0)) == 4  # copying until 4
    tiers.cached(["e", "f"], [4, 5])
    assert len(tiers.flush(2 * one)) == 2  # 4 in flight + 2 = 6 slots: queued behind a-d, until 6
    tiers.cached(["g"], [6])
    assert tiers.flush(3 * one) == []  # 6 in flight + 1 > 6: dropped
    tiers.cached(["h"], [7])
    assert tiers.flush(4.5 * one) == [("h", 7)]  # a-d written: 2 in flight + 1; queued behind e-f, 6 to 7
    assert (host.stored_blocks, host.dropped_blocks) == (7, 1)
    assert host.write.busy_s == pytest.approx(7 * one)
    assert host.write.busy_until == pytest.approx(7 * one)
    assert host.store_wait_s == pytest.approx(4 * one + (6 - 2) * one + (7 - 4.5) * one)
    assert sorted(host.store.hashes()) == ["b", "c", "d", "e", "f", "h"]  # LRU: a out for h
    reported = tiers.metrics(prompt_tokens=100, makespan_s=10 * one)["cpu"]
    assert reported.store_wait_s == pytest.approx(10.5 * one)  # the same hand sum, in the replay's metrics
    assert reported.to_dict()["store_wait_s"] == pytest.approx(10.5 * one, abs=1e-6)


def test_a_store_larger_than_the_tier_is_dropped_on_an_idle_link() -> None:
    """Three blocks for a 2-block host tier: vLLM's prepare_store cannot free a third chunk and skips the store."""
    tiers = host_tier(2)
    tiers.cached(["a", "b", "c"], [0, 1, 2])
    assert tiers.flush(0.0) == []
    host = tiers.tiers[0]
    assert (host.stored_blocks, host.dropped_blocks, len(host.store), host.write.busy_s) == (0, 3, 0, 0.0)


def test_tiers_off_change_nothing() -> None:
    trace = three_requests()
    off = simulate(trace, config(cpu_kv_blocks=0), ("paged",)).to_dict()
    assert off["strategies"] == simulate(trace, config(), ("paged",)).to_dict()["strategies"]
    assert "tiers" not in off["strategies"]["paged"] and "without_tiers" not in off
    assert "cpu_kv_blocks" not in off["config"]


def test_simulate_replays_without_tiers_for_the_comparison() -> None:
    result = simulate(three_requests(), config(cpu_kv_blocks=8), ("paged", "oracle-reserve"))
    assert list(result.without_tiers) == ["paged"]  # the contiguous strategies cache nothing
    assert result.without_tiers["paged"].tiers == {}
    assert result.to_dict()["without_tiers"]["paged"]["mean_ttft_s"] > result.to_dict()["strategies"]["paged"][
        "mean_ttft_s"]


# -- the stores' eviction policies ---------------------------------------------------------------------------------

def test_lru_store_evicts_least_recently_used() -> None:
    store = LRUStore(3)
    for h in "abc":
        assert store.insert([h]) == []
    store.hit(["a", "z"])  # z is not stored: nothing to reuse
    assert store.insert(["d"]) == ["b"]
    assert store.insert(["a"]) == []  # stored again: recent, nothing evicted
    assert store.insert(["e", "f"]) == ["c", "d"]
    assert sorted(store.hashes()) == ["a", "e", "f"] and store.num_evictions == 3


def test_arc_keeps_reused_blocks_over_a_scan() -> None:
    # Blocks reused once (T2) survive a scan of blocks seen once, which LRU lets flush them.
    arc, lru = ARCStore(4), LRUStore(4)
    for store in (arc, lru):
        store.insert(["x", "y"])
        store.hit(["x", "y"])
        store.insert(["s1", "s2", "s3", "s4", "s5"])
    assert "x" in arc and "y" in arc
    assert "x" not in lru and "y" not in lru


def test_arc_ghost_hit_moves_the_target() -> None:
    arc = ARCStore(2)
    arc.insert(["a", "b"])
    assert arc.insert(["c"]) == ["a"]  # T1 at its target (0): its oldest goes, remembered in B1
    assert arc.insert(["a"]) == ["b"]  # a B1 ghost stored again: recency pays, T1's target grows
    assert arc.target_t1 == 1.0 and not arc.violations()


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([LRUStore, ARCStore]), st.integers(1, 6),
       st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=60))
def test_stores_keep_their_invariants(kind: type, capacity: int, operations: list[tuple[bool, int]]) -> None:
    store = kind(capacity)
    naive: set[int] = set()  # what is stored: inserted and not evicted since
    for is_insert, h in operations:
        if is_insert:
            evicted = store.insert([h])
            assert h not in evicted and all(e in naive for e in evicted)
            naive = (naive | {h}) - set(evicted)
        elif h in store:
            store.hit([h])
        assert set(store.hashes()) == naive and len(store) == len(naive) <= capacity
        assert not store.violations()


# -- whole replays ---------------------------------------------------------------------------------------------

def random_trace(seed: int, num_requests: int, spacing_s: float):
    """Requests sharing a few system prompts (uneven popularity), each with its own tokens after them."""
    rng = random.Random(seed)
    segments = {f"s{i}": BLOCK * rng.randint(1, 8) for i in range(6)}
    requests = [Request(f"r{i}", i * spacing_s, 0, rng.randint(1, 40), prefix=(f"s{min(rng.randint(0, 9), 5)}",))
                for i in range(num_requests)]
    requests = [dataclasses.replace(r, prompt_tokens=segments[r.prefix[0]] + rng.randint(1, 40)) for r in requests]
    return make_trace("random", requests, source="test", segments=segments)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(8, 20), st.integers(1, 30), st.integers(0, 40),
       st.sampled_from(["write-through", "on-eviction"]), st.sampled_from(["lru", "arc"]), st.booleans())
def test_replays_keep_the_tiers_invariants(seed: int, num_blocks: int, cpu: int, disk: int, policy: str,
                                           eviction: str, layerwise: bool) -> None:
    trace = random_trace(seed, 25, 0.01)
    cfg = SimConfig.of(QWEN3_8B, H200, num_blocks=num_blocks, block_size=BLOCK, cpu_kv_blocks=cpu,
                       disk_kv_blocks=disk, offload_policy=policy, tier_eviction=eviction, layerwise_loads=layerwise,
                       check_invariants=True, max_model_len=512)
    run = Replay(trace, cfg, cfg.allocator("paged"), True, None)
    metrics = run.run()
    assert metrics.invariant_violations == 0 and not run.tiers.violations()
    assert metrics.completed_requests + metrics.rejected_requests == trace.num_requests
    for tier in run.tiers.tiers:
        assert len(tier.store) <= tier.store.capacity
        assert tier.write.num_bytes == tier.stored_blocks * BLOCK_BYTES
        assert metrics.tiers[tier.name].loaded_bytes == tier.loaded_blocks * BLOCK_BYTES
    hits = metrics.prefix_cache_hits + sum(t.hit_tokens for t in metrics.tiers.values())
    assert hits <= metrics.prefix_cache_queries


def naive_lru_hits(trace, capacity: int) -> int:
    """Prompt tokens found by a plain LRU cache of ``capacity`` blocks over the requests in arrival order: a
    request hits the longest run of its prompt's full blocks the cache holds (its last token computed), then
    every full block of its prompt is stored (hits and stores both count as uses)."""
    cache: OrderedDict[object, None] = OrderedDict()
    hits = 0
    for index, request in enumerate(trace.requests):
        own = request.prompt_tokens - sum(trace.segments[s] for s in request.prefix)
        keys = block_content_keys([*((s, trace.segments[s]) for s in request.prefix), (("prompt", index), own),
                                   (("output", index, 0), request.output_tokens)], BLOCK)
        prompt_keys = keys[:request.prompt_tokens // BLOCK]
        for key in prompt_keys[:(request.prompt_tokens - 1) // BLOCK]:
            if key not in cache:
                break
            hits += BLOCK
        for key in prompt_keys:
            cache[key] = None
            cache.move_to_end(key)
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits


@pytest.mark.parametrize("capacity", [30, 80, 200])
def test_a_tiny_gpu_pool_over_a_host_tier_is_a_plain_lru(capacity: int) -> None:
    # Requests one at a time (1 s apart, each done in milliseconds) with one output token, on a GPU pool of 12
    # blocks under a larger host tier: the tier sees every prompt block as the naive LRU does, and the totals agree
    # within a point. They differ by the GPU in front: its blocks add to the tier's, and vLLM's
    # order of recency within a request (the first block most recent) is not the naive one (the last).
    trace = random_trace(7, 300, 1.0)
    trace = make_trace("one-token", [dataclasses.replace(r, output_tokens=1) for r in trace.requests],
                       source="test", segments=trace.segments)
    cfg = SimConfig.of(QWEN3_8B, H200, num_blocks=12, block_size=BLOCK, cpu_kv_blocks=capacity, max_model_len=512)
    metrics = replay(trace, cfg, "paged")
    queries = metrics.prefix_cache_queries
    found = (metrics.prefix_cache_hits + metrics.tiers["cpu"].hit_tokens) / queries
    reference = naive_lru_hits(trace, capacity) / queries
    assert metrics.prefix_cache_hits / queries < reference - 0.2  # the GPU alone finds far less: the tier matters
    assert found == pytest.approx(reference, abs=0.01)


def test_simulate_prints_and_writes_the_tiers(tmp_path) -> None:
    from typer.testing import CliRunner

    from minipaged_cli.cli.main import app
    from tests.conftest import ROOT

    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["simulate", str(ROOT / "traces" / "burst.yaml"), "--strategies", "paged",
                                      "--cpu-kv-memory", "1GiB", "--disk-kv-memory", "4GiB", "--block-size", "16",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "Prefix-cache tiers below the GPU" in result.output and "With and without the tiers" in result.output
    document = json.loads(out.read_text())
    assert set(document["strategies"]["paged"]["tiers"]) == {"cpu", "disk"}
    assert document["config"]["cpu_kv_blocks"] == 2**30 // BLOCK_BYTES
    assert "tiers" not in document["without_tiers"]["paged"]
