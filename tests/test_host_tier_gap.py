"""``benchmarks/host_tier_gap.py``'s ``exclusive`` variant moves loaded blocks out of an LRU host tier: under ARC it
refuses up front (it reached into ``LRUStore``'s entries and failed mid-replay with an AttributeError)."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.host_tier_gap import MAX_MODEL_LEN, run
from benchmarks.replay_cpu import default_config
from minipaged_cli.workloads.trace import Request, make_trace


def test_the_exclusive_variant_refuses_an_arc_host_tier() -> None:
    trace = make_trace("t", [Request("a", 0.0, 64, 2)], source="test")
    base = dataclasses.replace(default_config(MAX_MODEL_LEN, prefix_caching=True, scheduler="v1"),
                               tier_eviction="arc")
    with pytest.raises(AssertionError, match="the exclusive variant needs an LRU host tier, not 'arc'"):
        run(trace, base, base.num_blocks * base.block_size + 1024, "on-eviction", ["exclusive"])
