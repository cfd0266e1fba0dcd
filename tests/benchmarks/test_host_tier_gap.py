"""``benchmarks/host_tier_gap.py``'s ``exclusive`` variant is ``--tier-inclusion exclusive``: it runs under ARC
as under LRU (the monkeypatch it replaced reached into ``LRUStore``'s entries and refused ARC up front)."""

from __future__ import annotations

import pytest

from benchmarks.host_tier_gap import MAX_MODEL_LEN, run
from benchmarks.replay_cpu import default_config
from minipaged_cli.workloads.trace import Request, make_trace


@pytest.mark.parametrize("eviction", ["lru", "arc"])
def test_the_exclusive_variant_runs_under_either_eviction(eviction: str) -> None:
    # One 64-token prompt, 2 output tokens, alone: the GPU and the host tier find nothing of it
    trace = make_trace("t", [Request("a", 0.0, 64, 2)], source="test")
    base = default_config(MAX_MODEL_LEN, prefix_caching=True, scheduler="v1").with_settings(tier_eviction=eviction)
    row = run(trace, base, base.cache.num_blocks * base.block_size + 1024, "on-eviction", ["exclusive"])
    assert (row["gpu_pct"], row["host_loaded_pct"], row["dropped_stores"]) == (0.0, 0.0, 0)
