"""Private keys (``sim/private_keys.py``, ``pool_loops.PRIVATE``): a block whose content no other request of the
trace names carries ``PRIVATE`` instead of its key, and makes no cache entry until its own request, preempted, may
look it up again. Checked against every block carrying its key (a scheduler whose ``shared_segments`` is None, the
reference): which keys are private against the keys every request of a random trace would carry; and random
replays under memory pressure (preemptions, chunked prefill, cache-aware admission, parallel samples, a fleet),
the same decisions and figures, step by step, and no invariant broken."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minipaged_cli.fleet import fleet as fleet_module
from minipaged_cli.fleet.config import FleetConfig, KvLink, ReplicaPool, RouterConfig
from minipaged_cli.fleet.fleet import run_fleet
from minipaged_cli.memory.pool_loops import PRIVATE
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.private_keys import private_keys, shared_segments
from minipaged_cli.sim.replay import Replay
from minipaged_cli.sim.scheduler import content_keys
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request, Trace, make_trace

# Shared segments of several lengths (37 and 45: blocks straddle their boundaries), and segments each named by one
# request at most ("own0", ...)
SEGMENTS = {"sys": 64, "doc": 37, "faq": 45, **{f"own{i}": 24 + i for i in range(40)}}


def random_trace(rng: np.random.Generator, count: int, *, samples: bool) -> Trace:
    """``count`` requests over 1.5 s: a prefix of shared segments (maybe none), then maybe a segment of its own and
    more shared ones after it, then tokens of its own; some with parallel samples."""
    requests = []
    for i in range(count):
        prefix = [str(name) for name in rng.choice(["sys", "doc", "faq"], size=int(rng.integers(0, 3)))]
        if rng.random() < 0.5:
            prefix.append(f"own{i}")
            prefix += [str(name) for name in rng.choice(["sys", "doc"], size=int(rng.integers(0, 2)))]
        prompt = sum(SEGMENTS[name] for name in prefix) + int(rng.integers(1, 200))
        n = int(rng.choice([1, 1, 1, 2])) if samples else 1
        requests.append(Request(f"r{i}", float(rng.uniform(0, 1.5)), prompt, int(rng.integers(1, 120)),
                                tuple(prefix), n))
    return make_trace("t", requests, source="test", segments=SEGMENTS)


def test_private_keys_worked_by_hand() -> None:
    """Blocks of 16 tokens. r0 names (sys, doc), r1 (sys, own1): sys (64 tokens) is named twice, doc and own1 once.
    r0's prompt is 64 + 37 + 7 = 108 tokens and it writes 20: 128 tokens, 8 full blocks, of which sys fills the
    first 4 and the other 4 hold doc's tokens, its own and its output. So r0's first 4 keys, then 4 ``PRIVATE``;
    r1 (100 + 5 tokens: 6 blocks) its first 4, then 2."""
    requests = [Request("r0", 0.0, 108, 20, ("sys", "doc")), Request("r1", 0.0, 100, 5, ("sys", "own1"))]
    trace = make_trace("t", requests, source="test", segments=SEGMENTS)
    shared = shared_segments(trace.requests)
    assert shared == {"sys"}
    keys = private_keys(trace.requests[0], SEGMENTS, shared, 16)
    full = content_keys(trace.requests[0], 0, 0, SEGMENTS, 16)
    assert len(full) == 8
    assert keys == full[:4] + [PRIVATE] * 4
    assert private_keys(trace.requests[1], SEGMENTS, shared, 16) == \
        content_keys(trace.requests[1], 1, 0, SEGMENTS, 16)[:4] + [PRIVATE] * 2
    # A prompt whose first segment no other request names, or that names none: every key is its own
    # ((24 + 2 + 30) // 16 = 3 blocks; 47 // 16 = 2)
    assert private_keys(Request("r2", 0.0, 26, 30, ("own2",)), SEGMENTS, shared, 16) == [PRIVATE] * 3
    assert private_keys(Request("r3", 0.0, 40, 7), SEGMENTS, shared, 16) == [PRIVATE] * 2


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 16]))
def test_a_key_another_request_carries_is_never_private(seed: int, block_size: int) -> None:
    """Against every request's keys in full (``content_keys``): a request's private keys are its keys with a tail
    of ``PRIVATE``, and no key there is one that another request carries (which its lookup could find)."""
    trace = random_trace(np.random.default_rng(seed), 12, samples=False)
    shared_names = shared_segments(trace.requests)
    full = [content_keys(request, index, 0, SEGMENTS, block_size) for index, request in enumerate(trace.requests)]
    carriers = Counter(key for keys in full for key in set(keys))
    for request, keys in zip(trace.requests, full, strict=True):
        private = private_keys(request, SEGMENTS, shared_names, block_size)
        shared = len(private) - private.count(PRIVATE)
        assert private == keys[:shared] + [PRIVATE] * (len(keys) - shared)
        assert all(carriers[key] == 1 for key in keys[shared:])
        if all(name in shared_names for name in request.prefix):  # (the blocks within its segments keep their keys)
            assert shared == sum(SEGMENTS[name] for name in request.prefix) // block_size


def _replays(trace: Trace, config: SimConfig, *, bulk: bool) -> tuple:
    """The replay with private keys and the reference's: their figures and timelines."""
    private = Replay(trace, config, config.allocator("paged"), bulk, None)
    assert private.scheduler.shared_segments is not None
    reference = Replay(trace, config, config.allocator("paged"), bulk, None)
    reference.scheduler.shared_segments = None
    return private.run(), reference.run()


@settings(max_examples=30, deadline=None)
@example(seed=3, num_blocks=24, chunk=None, window=0, samples=True)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(20, 90), chunk=st.sampled_from([None, 48]),
       window=st.sampled_from([0, 4]), samples=st.booleans())
def test_replays_with_private_keys_decide_as_the_reference(seed: int, num_blocks: int, chunk: int | None, window: int,
                                                           samples: bool) -> None:
    """Blocks of 16 tokens in a pool of 20 to 90: preemptions are frequent, and a preempted request with private
    keys looks its own blocks up again. Every figure and every step's categories equal the reference's, one step
    at a time and in bulk."""
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, int(rng.integers(4, 30)), samples=samples)
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=num_blocks, block_size=16,
                          max_model_len=1024, max_batched_tokens=chunk, prefix_caching=True, check_invariants=True,
                          cache_aware_admission_window=window, record_timeline=True)
    for bulk in (True, False):
        private, reference = _replays(trace, config, bulk=bulk)
        assert private.measurements() == reference.measurements()
        assert private.timeline == reference.timeline
        assert private.invariant_violations == 0


def test_the_example_preempts_requests_with_private_keys_that_hit_their_own_blocks() -> None:
    """The explicit example above reaches the case that matters: a request with private keys is preempted, takes
    its keys back, and is readmitted while blocks it computed are still cached (a hit of its own)."""
    rng = np.random.default_rng(3)
    trace = random_trace(rng, int(rng.integers(4, 30)), samples=True)
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=24, block_size=16,
                          max_model_len=1024, prefix_caching=True, check_invariants=True)
    run = Replay(trace, config, config.allocator("paged"), True, None)
    scheduler, allocator = run.scheduler, run.allocator
    named: set[int] = set()  # the victims that had private keys
    own_hits = []  # whether a lookup of one of them found more than its shared blocks
    drop, cached_prefix = scheduler._drop, allocator.cached_prefix

    def dropping(victim) -> None:
        if victim.private_keys:
            named.add(victim.sequence_id)
        drop(victim)

    def looking_up(holding, prompt_length: int) -> int:
        cached = cached_prefix(holding, prompt_length)
        if holding.sequence_id in named:  # (past the blocks its shared segments fill: content of its own)
            keys = private_keys(holding.request, SEGMENTS, scheduler.shared_segments, 16)
            own_hits.append(cached > 16 * (len(keys) - keys.count(PRIVATE)))
        return cached

    scheduler._drop = dropping  # type: ignore[method-assign]
    allocator.cached_prefix = looking_up  # type: ignore[method-assign]
    run.run()
    assert named and any(own_hits)


@pytest.mark.parametrize(("router", "index", "private"), [("round-robin", "precise", [True] * 4),
                                                         ("least-loaded", "precise", [True] * 4),
                                                         ("prefix-aware", "approximate", [True] * 4),
                                                         ("prefix-aware", "precise", [False] * 4),
                                                         ("round-robin", "P/D", [True] * 3 + [False])])
def test_a_fleet_with_private_keys_decides_as_the_reference(router: str, index: str, private: list[bool],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Four replicas, whose own traces are empty: each replica's scheduler reads the fleet trace's shared segments.
    A router's index fed by the replicas' KV events is told every key: there, none is private. Under P/D
    disaggregation, three prefill replicas and a decode one, which loads what they computed by its keys: its
    requests keep theirs."""
    trace = random_trace(np.random.default_rng(5), 40, samples=False)
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=40, block_size=16,
                          max_model_len=1024, prefix_caching=True, check_invariants=True)
    if index == "P/D":
        decode = config.with_settings(num_blocks=80)  # (a decode replica holds a request of max_model_len)
        fleet = FleetConfig((ReplicaPool("p", 3, config, role="prefill"), ReplicaPool("d", 1, decode, role="decode")),
                            RouterConfig(router), kv_link=KvLink(50e9, 20e-6), prefill_threshold=64)
    else:
        fleet = FleetConfig((ReplicaPool("replicas", 4, config),), RouterConfig(router, prefix_index=index))
    result = run_fleet(trace, fleet)
    assert [replica.replay.scheduler.shared_segments is not None and replica.replay.scheduler.tiers is None
            for replica in result.replicas] == private
    monkeypatch.setattr(fleet_module, "shared_segments", lambda requests: None)
    reference = run_fleet(trace, fleet)
    assert result.to_dict() == reference.to_dict()
    assert [r.replay.metrics().measurements() for r in result.replicas] == \
        [r.replay.metrics().measurements() for r in reference.replicas]
