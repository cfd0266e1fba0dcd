"""Exclusive tiers (``--tier-inclusion exclusive``, sim/tiers.py): a block the GPU caches leaves the tiers below,
and goes down again when the GPU evicts it. A hand-worked timeline where inclusive and exclusive tiers find
different hits, the exclusivity invariant under random traces (and shown to catch a planted bug), the stores'
``remove``, and the option through ``simulate`` and ``sweep``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.memory.tier_store import ARCStore, LRUStore, TierStore
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay, replay
from minipaged_cli.workloads.trace import Request, make_trace
from tests.conftest import ROOT
from tests.sim.test_tiers import BLOCK, BLOCK_BYTES, H200, QWEN3_8B, random_trace


def three_segments_twice():
    """Six requests 10 s apart, one output token each: X, Y, Z, X, Y, Z, each a 64-token segment (4 full blocks)
    and one token of its own. Each request's 65 + 1 tokens take 5 blocks, the whole GPU pool of 5: it evicts the
    4 blocks the request before cached (no request finds its segment on the GPU)."""
    names = ["x", "y", "z", "x", "y", "z"]
    requests = [Request(f"r{i}", 10.0 * i, 65, 1, prefix=(name,)) for i, name in enumerate(names)]
    return make_trace("xyz", requests, source="test", segments=dict.fromkeys(names, 64))


def tiers_config(inclusion: str, **fields: object) -> SimConfig:
    return SimConfig.of(QWEN3_8B, H200, num_blocks=5, block_size=BLOCK, offload_policy="on-eviction",
                        tier_inclusion=inclusion, check_invariants=True, **fields)


@pytest.mark.parametrize(("inclusion", "hit_blocks", "stored_blocks", "evictions"),
                         [("inclusive", 8, 16, 8), ("exclusive", 9, 20, 6)])
def test_a_host_tier_of_two_segments_behind_a_gpu_of_one(inclusion: str, hit_blocks: int, stored_blocks: int,
                                                         evictions: int) -> None:
    # A host tier of 8 blocks (two segments) under the GPU's 4 cached blocks (one): 12 blocks, the three segments.
    # On-eviction, the host tier's LRU order after each request (oldest first), GPU's segment in brackets. A
    # request's allocation evicts 3 of its predecessor's blocks (the 4th when its step takes its last block), last
    # block first: they go down at once, while the blocks a load issued with that allocation reads are pinned.
    #   inclusive                                    exclusive
    #   X: [X]                                       [X]
    #   Y: X [Y]          (X stored)                 X [Y]
    #   Z: X Y [Z]        (Y stored)                 X Y [Z]
    #   X: loads X (the tier keeps it, reused:       X loads X (pinned); Z's 3 last blocks evict Y's 3 last;
    #      newest); Z stored evicts Y: X Z [X]       X leaves once loaded; Z's first goes down: Y1 Z [X]
    #   Y: misses (Y evicted): computes it; X goes    Y loads its first block (it leaves); X stored: Z X [Y]
    #      down, already held: reused, no copy: Z X [Y]
    #   Z: loads Z (kept, newest: X Z), Y stored      Z loads Z (pinned); Y's 3 last evict X's 3 last; Z
    #      evicts X: Z Y [Z]                          leaves; Y's first goes down: X1 Y [Z]
    # Inclusive finds 2 segments (8 blocks), stores 4 x 4 blocks and evicts 2 x 4; exclusive finds 9 blocks,
    # stores 5 x 4 and evicts 2 x 3: the inclusive tier spent a segment's room on the GPU's copy of X, the
    # exclusive one spends it, briefly, on the blocks a load reads.
    metrics = replay(three_segments_twice(), tiers_config(inclusion, cpu_kv_blocks=8), "paged")
    cpu = metrics.tiers["cpu"]
    assert metrics.prefix_cache_hits == 0 and metrics.invariant_violations == 0
    assert (cpu.hit_tokens, cpu.recomputed_tokens) == (hit_blocks * BLOCK, 0)
    assert cpu.hit_pct == pytest.approx(100 * hit_blocks * BLOCK / (6 * 65))
    assert (cpu.stored_bytes, cpu.loaded_bytes) == (stored_blocks * BLOCK_BYTES, hit_blocks * BLOCK_BYTES)
    assert cpu.evictions == evictions


def test_a_block_loaded_from_disk_leaves_it() -> None:
    # A host tier of 4 blocks (one segment) over a disk of 4, on a disk 4x the preset's read speed (the preset's
    # loses to recomputing 64 tokens, test_tiers.test_disk_loads_cross_both_links). Exclusive, after each request
    # (a request's allocation evicts its predecessor's 3 last blocks, its step the first: test above):
    #   X: host -, disk -    Y: host X, disk -    Z: Y stored evicts X to the disk: host Y, disk X
    #   X: loads X from the disk, pinned there; Z's 3 last blocks evict Y's 3 last, which the disk has no room
    #      for (dropped); X leaves the disk; Z's first evicts Y's first to it: host Z, disk Y1
    #   Y: loads Y1 from the disk; X stored, Z to the disk: host X, disk Z
    #   Z: loads Z from the disk, pinned; Y's 3 last evict X's 3 last (dropped); Y's first evicts X's first to the
    #      disk: host Y, disk X1
    # Each block is in one tier throughout (the invariant check, every step): the disk delivers 4 + 1 + 4 blocks,
    # is written 4 + 1 + 4 + 1 blocks and drops 2 x 3; the host tier is written 5 x 4 (X, Y, Z, X, Y).
    fast = H200.__class__(**{**H200.__dict__, "disk_read_bytes_per_s": 4 * 7.45e9})
    cfg = SimConfig.of(QWEN3_8B, fast, num_blocks=5, block_size=BLOCK, offload_policy="on-eviction",
                       tier_inclusion="exclusive", cpu_kv_blocks=4, disk_kv_blocks=4, check_invariants=True)
    run = Replay(three_segments_twice(), cfg, cfg.allocator("paged"), True, None)
    metrics = run.run()
    disk, cpu = metrics.tiers["disk"], metrics.tiers["cpu"]
    assert metrics.invariant_violations == 0
    assert (disk.hit_tokens, disk.loaded_bytes, disk.stored_bytes) == (9 * BLOCK, 9 * BLOCK_BYTES,
                                                                       10 * BLOCK_BYTES)
    assert disk.dropped_stores == 6
    assert (cpu.hit_tokens, cpu.stored_bytes) == (0, 20 * BLOCK_BYTES)
    # At the end the GPU holds Z, the host tier Y, the disk X's first block
    assert (len(run.tiers.tiers[0].store), len(run.tiers.tiers[1].store)) == (4, 1)


def test_a_declined_load_leaves_the_tier_when_the_gpu_caches_the_recomputed_blocks() -> None:
    # At 1 MB/s a 4-block load takes 9.4 s: every request recomputes. X is stored when Y evicts it; at the second
    # X the rule declines the load (64 tokens counted recomputed) and the GPU caches the computed X: the tier
    # gives it up, so the host tier ends holding the two segments the GPU does not.
    slow = H200.__class__(**{**H200.__dict__, "host_bandwidth_bytes_per_s": 1e6, "host_bandwidth_efficiency": 1.0})
    cfg = SimConfig.of(QWEN3_8B, slow, num_blocks=5, block_size=BLOCK, offload_policy="on-eviction",
                       tier_inclusion="exclusive", cpu_kv_blocks=8, check_invariants=True)
    run = Replay(three_segments_twice(), cfg, cfg.allocator("paged"), True, None)
    metrics = run.run()
    cpu = metrics.tiers["cpu"]
    assert (cpu.hit_tokens, cpu.recomputed_tokens, cpu.loaded_bytes) == (0, 3 * 64, 0)
    assert metrics.invariant_violations == 0
    held = set(run.tiers.tiers[0].store.hashes())
    assert len(held) == 8 and not any(map(run.allocator.manager.pool.is_cached, held))


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(8, 20), st.integers(1, 30), st.integers(0, 40),
       st.sampled_from(["lru", "arc"]), st.booleans())
def test_exclusive_replays_hold_each_block_once(seed: int, num_blocks: int, cpu: int, disk: int, eviction: str,
                                               layerwise: bool) -> None:
    # Requests 10 ms apart (many in flight, loads and stores overlapping): at every step's end no block is both in
    # the GPU's prefix cache and in a tier, nor in both tiers (``TieredCache.violations``, checked every step);
    # independently here at the end: the tiers' hashes against the GPU pool's cache map.
    trace = random_trace(seed, 25, 0.01)
    cfg = SimConfig.of(QWEN3_8B, H200, num_blocks=num_blocks, block_size=BLOCK, cpu_kv_blocks=cpu,
                       disk_kv_blocks=disk, offload_policy="on-eviction", tier_eviction=eviction,
                       tier_inclusion="exclusive", layerwise_loads=layerwise, check_invariants=True, max_model_len=512)
    run = Replay(trace, cfg, cfg.allocator("paged"), True, None)
    metrics = run.run()
    assert metrics.invariant_violations == 0 and not run.tiers.violations()
    gpu = set(run.allocator.manager.pool.keyed_cache()[0])
    host = set(run.tiers.tiers[0].store.hashes())
    below = [host, set(run.tiers.tiers[1].store.hashes()) if disk else set()]
    assert not gpu & below[0] and not gpu & below[1] and not below[0] & below[1]
    assert metrics.completed_requests + metrics.rejected_requests == trace.num_requests


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000), st.integers(8, 16), st.integers(4, 40), st.booleans())
def test_exclusive_v0_replays_hold_each_block_once(seed: int, num_blocks: int, cpu: int, swap: bool) -> None:
    # v0 with prefix caching: the host tier is also the swap space; swapped-out slots are reserved, not cached
    # content, and all given back.
    trace = random_trace(seed, 25, 0.002)
    cfg = SimConfig.of(QWEN3_8B, H200, num_blocks=num_blocks, block_size=BLOCK, scheduler="v0", prefix_caching=True,
                       preemption="swap" if swap else "recompute", cpu_kv_blocks=cpu, offload_policy="on-eviction",
                       tier_inclusion="exclusive", check_invariants=True, max_model_len=512)
    run = Replay(trace, cfg, cfg.allocator("paged"), True, None)
    metrics = run.run()
    assert metrics.invariant_violations == 0 and not run.tiers.violations()
    assert run.tiers.tiers[0].store.num_reserved == 0


def test_the_invariant_check_catches_a_tier_that_keeps_what_the_gpu_caches(monkeypatch) -> None:
    # The planted bug: ``remove`` does nothing (an inclusive tier under the exclusive name). The second X's load
    # leaves X on the GPU and in the host tier: the check counts the steps it sees that in.
    monkeypatch.setattr(LRUStore, "remove", lambda self, block_hashes: None)
    metrics = replay(three_segments_twice(), tiers_config("exclusive", cpu_kv_blocks=8), "paged")
    assert metrics.invariant_violations > 0


@pytest.mark.parametrize("kind", [LRUStore, ARCStore])
def test_remove_takes_blocks_out_without_evicting(kind: type[TierStore]) -> None:
    store = kind(4)
    store.insert([1, 2, 3])
    store.hit([2])
    store.remove([2, 3, 9])  # 9: not stored, ignored
    assert set(store.hashes()) == {1} and store.num_evictions == 0 and not store.violations()
    assert store.insert([4, 5, 6]) == []  # the room they left is free: nothing evicted for three more
    assert set(store.hashes()) == {1, 4, 5, 6}


def test_arc_remembers_no_ghost_for_a_removed_block() -> None:
    # A block that moved up was not given up by the policy: storing it again must not move T1's target (a B1 hit
    # would, test_tiers.test_arc_ghost_hit_moves_the_target).
    store = ARCStore(2)
    store.insert([1])
    store.remove([1])
    store.insert([1])
    assert store.target_t1 == 0.0 and not store.b1 and not store.b2


def test_simulate_writes_the_option_only_when_exclusive(tmp_path) -> None:
    runner = CliRunner()
    documents = {}
    for inclusion in ("inclusive", "exclusive"):
        out = tmp_path / f"{inclusion}.json"
        result = runner.invoke(app, ["simulate", str(ROOT / "traces" / "burst.yaml"), "--strategies", "paged",
                                     "--cpu-kv-memory", "1GiB", "--offload-policy", "on-eviction",
                                     "--tier-inclusion", inclusion, "--check-invariants", "--json", str(out)])
        assert result.exit_code == 0, result.output
        assert ("lru eviction, whole loads, exclusive)" in result.output) == (inclusion == "exclusive")
        documents[inclusion] = json.loads(out.read_text())["config"]
    assert "tier_inclusion" not in documents["inclusive"]  # (the default's documents keep their bytes)
    assert documents["exclusive"]["tier_inclusion"] == "exclusive"


def test_sweep_crosses_the_inclusions(tmp_path) -> None:
    # The hand-worked timeline above as a trace file, swept at one rate (arrivals re-timed, the order kept): each
    # point replays its own inclusion, 8 host-hit blocks inclusive, 9 exclusive, of 6 x 65 prompt tokens.
    trace = tmp_path / "xyz.yaml"
    trace.write_text("version: 1\nname: xyz\nsegments: {x: 64, y: 64, z: 64}\nrequests:\n" + "".join(
        f"  - {{id: r{i}, arrival_s: {10.0 * i}, prompt_tokens: 65, output_tokens: 1, prefix: [{name}]}}\n"
        for i, name in enumerate("xyzxyz")))
    out = tmp_path / "sweep.json"
    result = CliRunner().invoke(app, ["sweep", str(trace), "--rates", "0.1", "--strategies", "paged",
                                      "--kv-memory", str(5 * BLOCK_BYTES), "--cpu-kv-memory", str(8 * BLOCK_BYTES),
                                      "--offload-policy", "on-eviction", "--tier-inclusion", "inclusive,exclusive",
                                      "--block-sizes", "16", "--workers", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    hits = {row["tier_inclusion"]: row["tier_hit_pct"] for row in json.loads(out.read_text())["points"]}
    assert hits == pytest.approx({"inclusive": 100 * 8 * BLOCK / 390, "exclusive": 100 * 9 * BLOCK / 390},
                                 abs=1e-4)
