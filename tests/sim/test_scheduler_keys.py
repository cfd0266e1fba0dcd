"""When a request's blocks get their content keys: only the first waiting requests have them (the queue's head, or
the cache-aware admission's window), every running one has them, and building them there rather than at arrival
changes no decision and no figure (against the scheduler building every request's keys as it arrives)."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.pool_loops import PRIVATE
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.replay import Replay
from minipaged_cli.sim.scheduler import Scheduler, content_keys
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec, load_gpu, load_model
from minipaged_cli.workloads.trace import Request, Trace, make_trace
from tests.sim.test_replay import SEGMENTS, random_requests


def _expected_keys(scheduler: Scheduler, live: LiveRequest) -> list:
    """The keys the request's blocks are named by, worked out afresh: where it has private keys, ``PRIVATE`` past
    the ones it shares (which blocks those are: ``tests/sim/test_private_keys.py``)."""
    keys = content_keys(live.request, live.request_index, live.sample, scheduler.segments,
                        scheduler.cache.block_size)
    if live.private_keys:
        shared = len(live.block_hashes) - live.block_hashes.count(PRIVATE)
        keys[shared:] = [PRIVATE] * (len(keys) - shared)
    return keys


def _keyed(requests: list[LiveRequest]) -> list[int]:
    return [live.sequence_id for live in requests if live.keys_built]


def _new_replay(trace: Trace, config: SimConfig, *, keys_at_arrival: bool = False) -> Replay:
    replay = Replay(trace, config, config.allocator("paged"), bulk=True, progress=None)
    if keys_at_arrival:  # the reference: every request keyed as it is queued, the queue being never longer
        replay.scheduler.keyed_span = 4 * len(trace.requests) * max(r.n for r in trace.requests)
    return replay


def test_only_the_queue_head_has_keys(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # One request runs at a time (max_num_seqs 1); five arrive together, each 64 prompt tokens (16 blocks of 4)
    # and 3 out: the first pass admits r0 and leaves r1..r4 waiting, of which only r1, the head, has keys.
    # With a cache-aware window of 3 the first three waiting (r1, r2, r3) have them.
    trace = make_trace("t", [Request(f"r{i}", 0.0, 64, 3) for i in range(5)], source="test")
    for window, keyed in ((0, [1]), (3, [1, 2, 3])):
        config = SimConfig.of(tiny_model, clock_gpu, num_blocks=100, block_size=4, max_model_len=128,
                              max_num_seqs=1, prefix_caching=True, cache_aware_admission_window=window)
        replay = _new_replay(trace, config)
        scheduler = replay.scheduler
        replay.iterate()
        assert [live.sequence_id for live in scheduler.running] == [0]
        assert _keyed(scheduler.waiting) == keyed
        assert all(live.block_hashes == [] for live in scheduler.waiting if not live.keys_built)
        for live in [*scheduler.running, *scheduler.waiting]:
            if live.keys_built:
                assert live.block_hashes == _expected_keys(scheduler, live)
                assert len(live.block_hashes) == (64 + 3) // 4  # its prompt's and output's full blocks
        # r0 decodes its 3 tokens and leaves; r1 is admitted and the next one moves into the keyed span
        while [live.sequence_id for live in scheduler.running] != [1]:
            replay.iterate()
        assert _keyed(scheduler.waiting) == [k + 1 for k in keyed]


def test_without_prefix_caching_no_request_has_keys(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    trace = make_trace("t", [Request(f"r{i}", 0.0, 64, 3) for i in range(3)], source="test")
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=100, block_size=4, max_model_len=128, max_num_seqs=1,
                          prefix_caching=False)
    replay = _new_replay(trace, config)
    replay.iterate()
    assert not any(live.keys_built or live.block_hashes for live in [*replay.scheduler.running,
                                                                     *replay.scheduler.waiting])


def _check_keys(scheduler: Scheduler) -> None:
    """Every running request and the first ``keyed_span`` waiting ones have their keys, and they are right."""
    waiting = list(scheduler.waiting)
    for live in [*scheduler.running, *waiting[:scheduler.keyed_span]]:
        assert live.keys_built, f"request {live.sequence_id} is read without its keys"
        assert live.block_hashes == _expected_keys(scheduler, live)


@settings(max_examples=30, deadline=None)
@example(seed=7, num_blocks=30, scheduler="v1", window=2, chunk=64, max_num_seqs=256, swap=False)
@example(seed=11, num_blocks=30, scheduler="v0", window=0, chunk=None, max_num_seqs=2, swap=True)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(30, 120), scheduler=st.sampled_from(["v1", "v0"]),
       window=st.sampled_from([0, 1, 2, 8]), chunk=st.sampled_from([None, 64]),
       max_num_seqs=st.sampled_from([1, 2, 256]), swap=st.booleans())
def test_keys_near_the_head_decide_as_keys_at_arrival(seed: int, num_blocks: int, scheduler: str, window: int,
                                                      chunk: int | None, max_num_seqs: int, swap: bool) -> None:
    # Random traces with shared prefixes and parallel samples on pools small enough to queue and preempt (recompute
    # or, v0, swap), under both schedulers and v1's cache-aware admission: keyed near the head, the replay's
    # measurements are exactly those of the scheduler that keys every request as it arrives, and every request the
    # scheduler reads has its keys, after every pass.
    rng = np.random.default_rng(seed)
    requests = random_requests(rng, int(rng.integers(3, 30)), True, own_tokens=300, output_tokens=150)
    swap = swap and scheduler == "v0"
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=num_blocks, block_size=16,
                          max_model_len=1024, max_batched_tokens=chunk if scheduler == "v0" else chunk or 2048,
                          prefix_caching=True, check_invariants=True, scheduler=scheduler,
                          max_num_seqs=max_num_seqs, preemption="swap" if swap else "recompute", cpu_blocks=8,
                          cache_aware_admission_window=window if scheduler == "v1" else 0,
                          cache_aware_admission_threshold=0.3)
    trace = make_trace("t", requests, source="test", segments=SEGMENTS)
    lazy = _new_replay(trace, config)
    while lazy.scheduler.has_work:
        lazy.iterate()
        _check_keys(lazy.scheduler)
    eager = _new_replay(trace, config, keys_at_arrival=True)
    assert lazy.metrics().measurements() == eager.run().measurements()
