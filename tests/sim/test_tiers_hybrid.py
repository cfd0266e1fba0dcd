"""The prefix cache's tiers under a model with sliding-window layers (sim/tiers.py over KV cache groups): tier
sizes in the pool's blocks, and vLLM 0.33.0's OffloadingConnector, which supports the hybrid KV cache manager
(``SupportsHMA``) and offloads per KV cache group: a full-attention group's blocks from the GPU's hit on, a
sliding-window group's only within the window at the hit's end."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay, replay
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.sim.tiers import TieredCache, sliding_hit_end
from minipaged_cli.workloads.presets import load_model
from minipaged_cli.workloads.trace import Request, Trace, make_trace
from tests.cli.test_bad_input_scheduling import BURST
from tests.conftest import VLLM_PYTHON, needs_vllm_venv
from tests.sim.test_tiers import H200, HOST_LINK, prefill_seconds, random_trace

GEMMA_ALL_LAYERS_BLOCK = 16 * 507_904  # gemma-3-27b: 62 layers of K/V, 507,904 B a token, 8,126,464 B a block


def test_a_tier_size_counts_the_blocks_the_replay_uses() -> None:
    # Without the hybrid manager a gemma-3-27b block holds all 62 layers (7.75 MiB); 1 GiB of host memory holds 132
    # of them. The size was converted with the hybrid manager's 10-layer pages (1.25 MiB): 819 blocks, 6.2x the
    # memory given.
    result = CliRunner().invoke(app, ["simulate", BURST, "--strategies", "paged", "--model", "gemma-3-27b",
                                      "--no-hybrid-kv", "--kv-memory", "8GiB", "--max-model-len", "4096",
                                      "--cpu-kv-memory", "1GiB", "--block-size", "16", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout[result.stdout.index("{"):])
    assert document["config"]["cpu_kv_blocks"] == 2**30 // GEMMA_ALL_LAYERS_BLOCK == 132


# -- per KV cache group, as vLLM's OffloadingConnector ------------------------------------------------------------

GPT_OSS = load_model("gpt-oss-20b")  # 24 layers: 12 sliding (W = 128) and 12 full, 2,048 B a token and layer
PAGE = 16 * 12 * 2048  # one block of one group: 393,216 B
WINDOW_BLOCKS = 8  # ceil(128 / 16): the blocks a sliding group's hit needs (vLLM's sliding_window_size_in_chunks)


def three_long_requests() -> Trace:
    """A (a 256-token system prompt + 1), B (another 256 + 1), C (A's prompt again), 10 s apart, one output token
    each."""
    requests = [Request("a", 0.0, 257, 1, prefix=("sys",)), Request("b", 10.0, 257, 1, prefix=("other",)),
                Request("c", 20.0, 257, 1, prefix=("sys",))]
    return make_trace("three", requests, source="test", segments={"sys": 256, "other": 256})


def test_a_hybrid_hit_loads_the_full_group_and_the_sliding_window() -> None:
    # A GPU pool of 34 blocks holds one request's 17 blocks in each of the 2 groups: B's allocation evicts all of
    # A's. A's and B's 16 full blocks in each group (32 pages each) were stored write-through in a host tier of 64.
    # C finds A's 16 blocks of the full group and, within them, the sliding group's last 8: it loads 16 + 8 = 24
    # pages (9,437,184 B, 189.0 us at 49.92 GB/s), not the sliding group's first 8, which its window never reads.
    trace = three_long_requests()
    config = SimConfig.of(GPT_OSS, H200, num_blocks=34, block_size=16, cpu_kv_blocks=64, check_invariants=True)
    metrics = replay(trace, config, "paged")
    model = StepTimeModel(GPT_OSS, H200)
    whole, rest = prefill_seconds(model, 257, 0), prefill_seconds(model, 1, 256)
    cpu = metrics.tiers["cpu"]
    assert (cpu.hit_tokens, cpu.loaded_bytes, cpu.stored_bytes) == (256, 24 * PAGE, 64 * PAGE)
    load_s = 24 * PAGE / HOST_LINK
    assert load_s == pytest.approx(189.0e-6, rel=1e-3)
    assert metrics.mean_ttft_s == pytest.approx((2 * whole + load_s + rest) / 3)
    assert metrics.invariant_violations == 0
    # The same memory without the hybrid manager: pages of all 24 layers, 16 of them to load (12.6 MB)
    flat = replay(trace, config.all_full_attention(), "paged").tiers["cpu"]
    assert flat.loaded_bytes == 16 * 2 * PAGE and flat.hit_tokens == 256


def host_tier_holding(keys: list[object]) -> TieredCache:
    config = SimConfig.of(GPT_OSS, H200, num_blocks=34, block_size=16, cpu_kv_blocks=100)
    pool = BlockPool(34, num_groups=len(config.kv_cache_groups), enable_caching=True)
    tiers = TieredCache(config.tiers, config.block_size, config.kv_cache_groups, pool,
                        StepTimeModel(GPT_OSS, H200))
    tiers.tiers[0].store.insert(keys)
    return tiers


SLIDING, FULL = 0, 1  # gpt-oss-20b's groups: the sliding layers come first


@pytest.mark.parametrize(("full", "sliding", "end", "sliding_loaded"), [
    (range(16), range(16), 16, range(8, 16)),  # everything: the window's last 8 blocks
    (range(16), [*range(6), *range(10, 16)], 6, range(6)),  # no run of 8: the run from the first block
    (range(16), range(2, 16), 16, range(8, 16)),  # the first blocks are not needed
    (range(12), range(16), 12, range(4, 12)),  # the full group ends the hit, the window ends with it
    (range(16), [*range(3, 11), 12, 13], 11, range(3, 11)),  # the last run of 8
    (range(16), range(1, 16), 16, range(8, 16)),
    ([], range(16), 0, []),
])
def test_the_hybrid_lookup_rule(full: range, sliding: list[int], end: int, sliding_loaded: range) -> None:
    hashes = [f"h{i}" for i in range(17)]
    tiers = host_tier_holding([(FULL, hashes[i]) for i in full] + [(SLIDING, hashes[i]) for i in sliding])
    counted, moved, keys = tiers.lookup_groups(hashes, 0, 16)
    assert len(counted) == end
    assert len(moved) == end + len(sliding_loaded)
    assert keys == [(FULL, hashes[i]) for i in range(end)] + [(SLIDING, hashes[i]) for i in sliding_loaded]


def test_the_hybrid_lookup_starts_after_the_gpu_hit() -> None:
    # A GPU hit of 4 blocks: the tiers are asked from block 4 on; a sliding run of 8 ending at 16 is blocks 8..15.
    hashes = [f"h{i}" for i in range(17)]
    tiers = host_tier_holding([(g, hashes[i]) for g in (FULL, SLIDING) for i in range(4, 16)])
    counted, moved, keys = tiers.lookup_groups(hashes, 4, 16)
    assert len(counted) == 12 and len(moved) == 12 + 8
    assert keys == [(FULL, h) for h in hashes[4:16]] + [(SLIDING, h) for h in hashes[8:16]]


@needs_vllm_venv
def test_the_sliding_run_agrees_with_vllm() -> None:
    # vLLM's own _sliding_window_lookup on 3,000 random patterns of held blocks (tests/parity/vllm_sliding_lookup.py)
    script = Path(__file__).parents[1] / "parity" / "vllm_sliding_lookup.py"
    done = subprocess.run([str(VLLM_PYTHON), str(script)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(done.stdout)
    assert len(cases) == 3000 and any(end for _, _, end in cases) and any(not end for _, _, end in cases)
    assert [sliding_hit_end(held, window) for held, window, _ in cases] == [end for _, _, end in cases]


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.integers(40, 80), st.integers(8, 60), st.sampled_from(["write-through",
                                                                                          "on-eviction"]))
def test_hybrid_replays_keep_the_invariants(seed: int, num_blocks: int, cpu: int, policy: str) -> None:
    trace = random_trace(seed, 25, 0.01)
    config = SimConfig.of(GPT_OSS, H200, num_blocks=num_blocks, block_size=16, cpu_kv_blocks=cpu,
                          offload_policy=policy, check_invariants=True, max_model_len=512)
    run = Replay(trace, config, config.allocator("paged"), True, None)
    metrics = run.run()
    assert metrics.invariant_violations == 0 and not run.tiers.violations()
    assert metrics.completed_requests + metrics.rejected_requests == trace.num_requests
    hits = metrics.prefix_cache_hits + metrics.tiers["cpu"].hit_tokens
    assert hits <= metrics.prefix_cache_queries
