"""Growing a run of decodes in one call (``Allocator.grows_in_batches``, ``memory/batched_growth.py``) against
the readable path that grows each running request through ``try_grow`` and ``KVBlockManager.grow``: the two
replays, driven side by side pass by pass, must make the same decisions, leave the same blocks, cache and free
queue, and measure the same figures, to the last bit."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.paged import PagedAllocator
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import make_trace
from tests.sim.test_replay import SEGMENTS, random_requests
from tests.sim.test_replay_hybrid import windowed_model


def replay_state(replay: Replay) -> tuple:
    """What a pass decided and left: the clock, the queues with each request's progress, every sequence's blocks
    and cache progress, the free queue in order, the pool's counters and the accounting's running totals."""
    scheduler, allocator = replay.scheduler, replay.allocator
    assert isinstance(allocator, PagedAllocator)
    manager, accounting = allocator.manager, replay.accounting
    progress = [(r.sequence_id, r.num_computed, r.num_generated, r.num_prefill_tokens, r.loading_tokens)
                for r in scheduler.running]
    sequences = {sequence_id: (state.sequence_length, state.num_computed_tokens, state.block_tables,
                               state.num_null, state.num_cached_blocks, state.num_held_blocks)
                 for sequence_id, state in manager.sequences.items()}
    pool = manager.pool
    counters = (pool.num_evictions, pool.num_allocations, pool.num_frees, manager.num_copy_on_writes)
    totals = (accounting.num_steps, accounting.num_preemptions, accounting.batch_size_sum, accounting.running_time,
              accounting.peak_tokens, accounting.busiest_seq_lens, accounting.peak_used_slots,
              [list(accounting.integrator.saturated_sums), list(accounting.integrator.busy_sums)])
    return (replay.now, progress, [r.sequence_id for r in scheduler.waiting], sequences, list(pool.free_blocks),
            counters, totals)


def assert_batched_growth_is_exact(trace, config: SimConfig, bulk: bool) -> None:
    """Drive a replay that grows decodes in batches and one that grows them one by one (the reference) pass by
    pass; compare everything after each pass, and the invariants of the batched one."""
    batched = Replay(trace, config, config.allocator("paged"), bulk, None)
    reference = Replay(trace, config, config.allocator("paged"), bulk, None)
    reference.allocator.grows_in_batches = False  # (an instance attribute: the readable per-request path)
    assert batched.allocator.grows_in_batches
    passes = 0
    while batched.scheduler.has_work:
        assert reference.scheduler.has_work
        batched.iterate()
        reference.iterate()
        passes += 1
        assert replay_state(batched) == replay_state(reference), f"pass {passes}"
        assert batched.allocator.invariant_violations() == [], f"pass {passes}"
    assert not reference.scheduler.has_work
    assert batched.metrics().measurements() == reference.metrics().measurements()


def random_trace(seed: int, sharing: bool):
    """Up to 25 requests over 1.5 s: shared prefixes and parallel samples with ``sharing``."""
    rng = np.random.default_rng(seed)
    requests = random_requests(rng, int(rng.integers(2, 25)), sharing, own_tokens=200, output_tokens=120)
    return make_trace("t", requests, source="test", segments=SEGMENTS)


@settings(max_examples=30, deadline=None)
@example(seed=3, block_size=4, num_blocks=40, sharing=True, scheduler="v1", preemption="recompute", bulk=False,
         windowed=False, tiers=False)
@example(seed=5, block_size=4, num_blocks=30, sharing=True, scheduler="v0", preemption="swap", bulk=True,
         windowed=False, tiers=False)
@example(seed=8, block_size=4, num_blocks=60, sharing=True, scheduler="v1", preemption="recompute", bulk=True,
         windowed=True, tiers=False)
@example(seed=9, block_size=4, num_blocks=30, sharing=True, scheduler="v1", preemption="recompute", bulk=False,
         windowed=False, tiers=True)
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 16]), num_blocks=st.integers(20, 120),
       sharing=st.booleans(), scheduler=st.sampled_from(["v1", "v0"]),
       preemption=st.sampled_from(["recompute", "swap"]), bulk=st.booleans(), windowed=st.booleans(),
       tiers=st.booleans())
def test_batched_growth_equals_one_request_at_a_time(seed: int, block_size: int, num_blocks: int, sharing: bool,
                                                     scheduler: str, preemption: str, bulk: bool, windowed: bool,
                                                     tiers: bool) -> None:
    # Small pools: decodes cross block boundaries the pool cannot serve, so the first request that cannot grow
    # preempts the last one in the middle of a run of decodes. With sharing: prefix-cache hits, v1's samples as
    # requests and v0's forked ones (copy-on-write of a shared last block); a sliding-window model (v1 only: v0
    # has no hybrid manager); swap preemption (v0 only) and a host tier below the GPU (loading requests).
    windowed = windowed and scheduler == "v1"
    swap = preemption == "swap" and scheduler == "v0"
    tier_blocks = {"cpu_kv_blocks": 8 * 16 // block_size} if tiers and sharing and scheduler == "v1" else {}
    model = windowed_model(window=8) if windowed else load_model("qwen3-8b")
    config = SimConfig.of(model, load_gpu("h200"), num_blocks=num_blocks * 16 // block_size, block_size=block_size,
                          max_model_len=1024, max_batched_tokens=64, prefix_caching=sharing,
                          preemption="swap" if swap else "recompute", cpu_blocks=8 * 16 // block_size,
                          scheduler=scheduler, **tier_blocks)
    assert_batched_growth_is_exact(random_trace(seed, sharing), config, bulk)
