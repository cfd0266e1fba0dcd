"""The fleet's fast paths against their readable references: KV events read from the pool's key log and folded a
step at a time as set operations against one count per key folded event by event, key by key
(``CountedKvEvents``), on random event streams; a prompt's keys built as far as a lookup
reaches against all of them built at once, on random prompts and caches; the prefix router's search that counts no
match that cannot reach the best against every replica's score; and a whole fleet with the clock's heap
(under round-robin, every request routed before the replays start; a bulk advance that another replica's request cut
resuming where it stopped), those events and those keys against the clock's scan of every replica, the counted events,
every key and fresh bulks, on random workloads under every router, decision for decision and figure for figure."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from minipaged_cli.fleet.config import FleetConfig, ReplicaPool, RouterConfig
from minipaged_cli.fleet.fleet import Fleet, FleetResult
from minipaged_cli.fleet.kv_events import CountedKvEvents, KvEvents
from minipaged_cli.fleet.prompt_keys import PromptKeys
from minipaged_cli.fleet.replica import Replica, ReplicaState
from minipaged_cli.fleet.routers import Router
from minipaged_cli.sim import bulk_advance
from minipaged_cli.sim.bulk_advance import BulkAdvance
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request, Trace
from tests.fleet.test_fleet import config

# A few keys, so that events repeat a key, store a key already held, remove one held twice or never stored
keys = st.lists(st.integers(0, 7), max_size=6)
operations = st.lists(st.one_of(st.tuples(st.just("cached"), keys), st.tuples(st.just("evicted"), keys),
                                st.tuples(st.just("publish"), st.just([])), st.tuples(st.just("query"), keys)),
                      max_size=40)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_set_folded_events_are_the_key_by_key_counts(stream: list[tuple[str, list[int]]]) -> None:
    fast, counted = KvEvents(), CountedKvEvents()
    for name, block_hashes in stream:
        if name == "publish":
            fast.publish()
            counted.publish()
            assert fast.counts == counted.counts
            assert not fast.ones & fast.others.keys() and 0 not in fast.others.values()
        elif name == "query":
            assert fast.matched_blocks(block_hashes) == counted.matched_blocks(block_hashes)
            assert [fast.holds(key) for key in block_hashes] == [key in counted.counts for key in block_hashes]
        else:  # (the pool appends an event's keys to its log: a step's events in one list each)
            (fast.log.stored if name == "cached" else fast.log.removed).extend(block_hashes)
            getattr(counted, name)(block_hashes, list(range(len(block_hashes))))


@st.composite
def prompts_and_caches(draw: st.DrawFn) -> tuple[Request, dict[str, int], int, set[int]]:
    """A prompt of shared segments (some shorter than a block, some not a whole number of blocks), maybe its own
    tokens after them, and a cache holding a random subset of its keys (from the reference's full list)."""
    lengths = draw(st.lists(st.integers(1, 40), max_size=12))
    segments = {f"s{i}": length for i, length in enumerate(lengths)}
    prompt = sum(lengths) + draw(st.integers(0 if lengths else 1, 30))
    request = Request("r", 0.0, prompt, draw(st.integers(1, 20)), prefix=tuple(segments))
    block_size = draw(st.sampled_from([1, 4, 16]))
    full = PromptKeys(request, 3, segments, block_size, lazy=False).all()
    return request, segments, block_size, set(draw(st.lists(st.sampled_from(full), unique=True)) if full else [])


@settings(max_examples=300, deadline=None)
@given(prompts_and_caches())
def test_keys_built_as_far_as_a_lookup_reaches_are_all_the_keys(case: tuple) -> None:
    request, segments, block_size, cached = case

    def lookup(keys: list) -> int:
        return next((i for i, key in enumerate(keys) if key not in cached), len(keys))

    lazy, full = PromptKeys(request, 3, segments, block_size), PromptKeys(request, 3, segments, block_size, lazy=False)
    assert lazy.matched(lookup) == full.matched(lookup)
    assert lazy.keys == full.keys[:len(lazy.keys)]  # (built so far: the first keys)
    assert lazy.all() == full.all() and len(full.keys) == full.num_blocks


def replay(trace: Trace, spec: FleetConfig, *, reference: bool) -> FleetResult:
    """``run_fleet``; the ``reference``: the clock scans every replica each pass, requests are routed as they are
    sent, the KV events are told each of the pool's events and count key by key (a subscriber: the pool takes its
    readable paths, in their order), every bulk advance starts afresh."""
    fleet = Fleet(trace, spec)
    if reference:
        fleet.clock.scan = True
        fleet.routes_ahead = False
        fleet.lazy_keys = False
        for replica in fleet.replicas:
            replica.replay.bulk_advance.resumes = False
            if replica.events is not None:
                pool = replica.replay.allocator.manager.pool  # type: ignore[attr-defined]
                pool.events.log = None
                replica.events = CountedKvEvents.subscribed_to(pool, replica.match_group)  # type: ignore[assignment]
    return fleet.run()


requests = st.lists(st.tuples(st.sampled_from([0.0, 0.001, 0.0102, 0.05, 0.3]), st.integers(100, 300),
                              st.integers(1, 40), st.sampled_from([(), ("a",), ("b",), ("a", "b", "c"),
                                                                   ("a", "c", "b", "a")])),
                    min_size=1, max_size=14)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.integers(1, 4), st.sampled_from(["round-robin", "least-loaded", "prefix-aware", "weighted"]),
       st.sampled_from([40, 400]))
def test_the_fleets_fast_paths_are_its_references(rows: list, num_replicas: int, router: str,
                                                               num_blocks: int) -> None:
    # Shared prefixes on small pools: the replicas cache, evict and preempt, and the prefix router reads it all
    rows.sort(key=lambda row: row[0])
    trace = Trace("random", tuple(Request(f"q{i}", t, p, o, prefix=x) for i, (t, p, o, x) in enumerate(rows)),
                  {"a": 32, "b": 48, "c": 16})
    spec = FleetConfig((ReplicaPool("replicas", num_replicas, config(num_blocks, max_model_len=400)),),
                       RouterConfig(router), log_decisions=True)
    fast, reference = replay(trace, spec, reference=False), replay(trace, spec, reference=True)
    assert fast.decisions == reference.decisions
    assert fast.to_dict() == reference.to_dict()
    assert fast.records == reference.records


class IndexedReplica:
    """What a router reads of a replica: its state as of a step's end, its load and its published KV events."""

    def __init__(self, index: int, state: ReplicaState, load: tuple[int, float, int], events: KvEvents) -> None:
        self.index, self.state, self._load, self.events = index, state, load, events

    def state_at(self, at: float) -> ReplicaState:
        return self.state

    def load(self, state: ReplicaState) -> tuple[int, float, int]:
        return self._load


@st.composite
def indexed_replicas(draw: st.DrawFn) -> tuple[PromptKeys, list[IndexedReplica]]:
    """A prompt's keys and replicas whose indexes hold its first keys (with gaps, or a key past a gap), loads from a
    few values (ties), some without room."""
    request, segments, block_size, _ = draw(prompts_and_caches())
    full = PromptKeys(request, 3, segments, block_size, lazy=False).all()
    replicas = []
    for index in range(draw(st.integers(1, 8))):
        held = draw(st.integers(0, len(full)))
        keys = set(full[:held]) - set(draw(st.lists(st.sampled_from(full), max_size=2)) if full else [])
        keys |= set(draw(st.lists(st.sampled_from(full), max_size=2)) if full else [])
        events = KvEvents()
        twice = draw(st.lists(st.sampled_from(sorted(keys)), max_size=2)) if keys else []
        events.log.stored = [*keys, *twice]
        events.publish()  # (some keys counted twice: ``others``)
        state = ReplicaState(draw(st.sampled_from([0, 0, 1])), 0, 0.0, 0)
        load = (draw(st.integers(0, 2)), draw(st.sampled_from([0.0, 0.5])), draw(st.integers(0, 1)))
        replicas.append(IndexedReplica(index, state, load, events))
    return PromptKeys(request, 3, segments, block_size), replicas


@settings(max_examples=500, deadline=None)
@given(indexed_replicas())
def test_the_prefix_routers_pruned_search_is_its_full_scores_choice(case: tuple) -> None:
    keys, replicas = case
    router = Router(RouterConfig("prefix-aware"), replicas)  # type: ignore[arg-type]
    full = PromptKeys(keys.request, 3, keys.segments, keys.block_size, lazy=False)
    assert router.route(0, keys, 0.0) is router.choose(0, full, 0.0)[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.integers(1, 5), st.sampled_from([40, 400]))
def test_the_prefix_routers_pruned_search_takes_the_replica_of_its_full_scores(rows: list, num_replicas: int,
                                                                                num_blocks: int) -> None:
    # Without a decision log the prefix router counts no match that cannot reach the best so far (``Router.route``):
    # at every arrival it takes the replica that ``choose`` picks from every replica's score (shared prefixes on
    # small pools: matches of every length, ties, replicas without room), and the fleet's figures are the logged
    # run's
    rows.sort(key=lambda row: row[0])
    trace = Trace("random", tuple(Request(f"q{i}", t, p, o, prefix=x) for i, (t, p, o, x) in enumerate(rows)),
                  {"a": 32, "b": 48, "c": 16})
    spec = FleetConfig((ReplicaPool("replicas", num_replicas, config(num_blocks, max_model_len=400)),),
                       RouterConfig("prefix-aware"))
    same: list[bool] = []
    route = Router.route

    def checked(router: Router, fleet_index: int, keys: PromptKeys | None, at: float,
                session: str | None = None) -> Replica:
        replica = route(router, fleet_index, keys, at, session)
        full = PromptKeys(trace.requests[fleet_index], fleet_index, trace.segments, 16, lazy=False)
        same.append(replica is router.choose(fleet_index, full, at, session)[0])
        return replica

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Router, "route", checked)
        pruned = Fleet(trace, spec).run()
    assert same and all(same)
    logged = Fleet(trace, replace(spec, log_decisions=True)).run()
    assert pruned.records == logged.records
    assert {**pruned.to_dict(), "decisions": None} == {**logged.to_dict(), "decisions": None}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.lists(st.sampled_from([1, 1, 3]), min_size=14, max_size=14), st.integers(1, 3),
       st.sampled_from(["qwen3-8b", "gpt-oss-20b"]))
def test_the_prefix_routers_index_is_its_reference_with_samples_and_windows(
        rows: list, samples: list[int], num_replicas: int, model: str) -> None:
    # Forked samples (their blocks cached through ``cache``, a key that a block already carries told again) and a
    # hybrid model's groups (the index reads its full-attention group's keys; 128-token windows slide, free blocks)
    rows.sort(key=lambda row: row[0])
    trace = Trace("random", tuple(Request(f"q{i}", t, p, o, prefix=x, n=n)
                                  for i, ((t, p, o, x), n) in enumerate(zip(rows, samples, strict=False))),
                  {"a": 32, "b": 48, "c": 16})
    sim = SimConfig.of(model=load_model(model), gpu=load_gpu("h200"), num_blocks=60, block_size=16, max_model_len=400)
    spec = FleetConfig((ReplicaPool("replicas", num_replicas, sim),), RouterConfig("prefix-aware"), log_decisions=True)
    fast, reference = replay(trace, spec, reference=False), replay(trace, spec, reference=True)
    assert fast.decisions == reference.decisions
    assert fast.to_dict() == reference.to_dict()


long_requests = st.lists(st.tuples(st.sampled_from([0.0, 0.001, 0.0102, 0.05, 0.3, 1.0]), st.integers(100, 500),
                                   st.integers(1, 150), st.sampled_from([(), ("a",), ("a", "b", "c")])),
                         min_size=1, max_size=16)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_requests, st.integers(2, 5), st.sampled_from([40, 400]))
def test_a_round_robin_fleet_routes_every_request_before_the_replays(rows: list, num_replicas: int,
                                                                    num_blocks: int) -> None:
    # Each replica then replays its own requests as ``simulate`` does: its bulk advances run on through arrivals
    # behind a waiting head, never cut by another replica's (long decodes on small pools, idle gaps, prompts over
    # the model's length refused on arrival); the reference routes each request as it is sent and stops every
    # replica at every arrival (the clock's scan)
    assume(any(p + o <= 560 for _, p, o, _ in rows))  # (a trace that no request of fits is refused whole)
    rows.sort(key=lambda row: row[0])
    trace = Trace("random", tuple(Request(f"q{i}", t, p, o, prefix=x) for i, (t, p, o, x) in enumerate(rows)),
                  {"a": 32, "b": 48, "c": 16})
    spec = FleetConfig((ReplicaPool("replicas", num_replicas, config(num_blocks, max_model_len=560)),),
                       RouterConfig("round-robin"), log_decisions=True)
    assert Fleet(trace, spec).routes_ahead
    # (a router that reads the replicas, and a timeline of every pass, keep the fleet's stops)
    assert not Fleet(trace, replace(spec, router=RouterConfig("least-loaded"))).routes_ahead
    assert not Fleet(trace, replace(spec, record_timeline=True)).routes_ahead
    fast, reference = replay(trace, spec, reference=False), replay(trace, spec, reference=True)
    assert fast.decisions == reference.decisions
    assert fast.to_dict() == reference.to_dict()
    assert fast.records == reference.records


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_requests, st.integers(2, 5), st.sampled_from(["least-loaded", "prefix-aware"]), st.sampled_from([40, 400]),
       st.sampled_from([bulk_advance.MAX_BULK_STEPS, 3, 8]), st.sampled_from([1024, 2]))
# (a head that the batch's limit holds back behind decodes that the other replica's requests cut: a resumed bulk
# counts the saturated steps from the slots the cut one had grown)
@example([(0.0, 222, 20, ()), (0.0, 100, 20, ()), (0.0, 182, 20, ()), (0.0, 100, 20, ()), (0.001, 177, 20, ()),
          (0.05, 100, 20, ())], 2, "least-loaded", 40, bulk_advance.MAX_BULK_STEPS, 2)
def test_a_bulk_cut_by_another_replicas_request_resumes_as_a_fresh_one(rows: list, num_replicas: int, router: str,
                                                                      num_blocks: int, max_bulk_steps: int,
                                                                      max_num_seqs: int) -> None:
    # A router that reads the replicas stops every busy replica at every arrival; the request goes to one, the
    # others resume the bulk they were cut in (long decodes on small pools: preemptions, a held-back head with
    # requests queued behind it, finishes at a cut; a head that the batch's limit holds back, saturated once the
    # decodes' blocks take its room; a bulk's bound on its steps short of the first finish, where a resumed one may
    # not go as far as a fresh one). The reference starts every bulk afresh; the replicas'
    # timelines (a point a pass) show that each pass ends where it did.
    assume(any(p + o <= 560 for _, p, o, _ in rows))
    rows.sort(key=lambda row: row[0])
    trace = Trace("random", tuple(Request(f"q{i}", t, p, o, prefix=x) for i, (t, p, o, x) in enumerate(rows)),
                  {"a": 32, "b": 48, "c": 16})
    spec = FleetConfig((ReplicaPool("replicas", num_replicas,
                                    config(num_blocks, max_model_len=560, max_num_seqs=max_num_seqs)),),
                       RouterConfig(router), log_decisions=True, record_timeline=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bulk_advance, "MAX_BULK_STEPS", max_bulk_steps)
        resuming, fresh = Fleet(trace, spec), Fleet(trace, spec)
        for replica in fresh.replicas:
            replica.replay.bulk_advance.resumes = False
        fast, reference = resuming.run(), fresh.run()
    assert [r.timeline for r in resuming.replicas] == [r.timeline for r in fresh.replicas]
    assert fast.decisions == reference.decisions
    assert fast.to_dict() == reference.to_dict()
    assert fast.records == reference.records


def test_bulks_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two long decodes, one a replica, and short requests every 50 ms, each sent to one replica and cutting the
    other's bulk: that one resumes (at most one fresh bulk less a request, at least ten here), the same figures."""
    rows = [(0.0, 200, 400, ()), (0.0, 200, 400, ())] + [(0.05 * i, 100, 2, ()) for i in range(1, 20)]
    trace = Trace("cuts", tuple(Request(f"q{i}", t, p, o, prefix=x) for i, (t, p, o, x) in enumerate(rows)), {})
    spec = FleetConfig((ReplicaPool("replicas", 2, config(4000, max_model_len=1000)),), RouterConfig("least-loaded"),
                       log_decisions=True)
    plans: list[int] = []  # (each fresh bulk: a plan, or, where none resumes, a compiled run)
    fresh_plan, fresh_run = BulkAdvance._plan, BulkAdvance._decode_run

    def counted_run(self: BulkAdvance, *args: object) -> object:
        run = fresh_run(self, *args)
        plans.extend([1] if run is not None else [])
        return run

    monkeypatch.setattr(BulkAdvance, "_plan", lambda self, *args: plans.append(1) or fresh_plan(self, *args))
    monkeypatch.setattr(BulkAdvance, "_decode_run", counted_run)
    fast = Fleet(trace, spec).run()
    num_resuming = len(plans)
    fresh = Fleet(trace, spec)
    for replica in fresh.replicas:
        replica.replay.bulk_advance.resumes = False
    reference = fresh.run()
    assert len(plans) - 2 * num_resuming >= 10
    assert fast.decisions == reference.decisions and fast.to_dict() == reference.to_dict()
