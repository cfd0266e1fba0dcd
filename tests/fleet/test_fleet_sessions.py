"""Sessions and clients across a fleet (``fleet/fleet.py`` driving ``sim/clients.py``) against references worked
by hand or run independently: a two-session affinity case counted in blocks, one closed-loop client over three
replicas, a cap that never binds, one replica against ``simulate``, and a property: nothing is lost."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minipaged_cli.fleet.config import FleetConfig, KvLink, ReplicaPool, RouterConfig
from minipaged_cli.fleet.fleet import FleetResult, run_fleet
from minipaged_cli.sim.clients import OPEN_LOOP, Clients
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import simulate
from minipaged_cli.workloads.sessions import Session, Turn
from minipaged_cli.workloads.trace import Request, Trace, make_trace
from tests.session_helpers import CLOCK_GPU, MODEL
from tests.sim.test_clients import random_requests, sessions_and_clients
from tests.workloads.test_sessions import generated


def engine(clients: Clients = OPEN_LOOP, **options: object) -> SimConfig:
    """The 1-ms-a-step engine of the session tests, in blocks of 16 tokens, invariants checked."""
    options.setdefault("block_size", 16)
    num_blocks = options.pop("num_blocks", 1000)
    return SimConfig.of(MODEL, CLOCK_GPU, num_blocks, check_invariants=True, clients=clients,  # type: ignore[arg-type]
                        **options)


def replay(trace: Trace, num_replicas: int, router: str = "round-robin", clients: Clients = OPEN_LOOP,
           weights: tuple[tuple[str, float], ...] | None = None, **options: object) -> FleetResult:
    sim = engine(clients, **options)
    router_config = RouterConfig(router, weights=weights) if weights else RouterConfig(router)
    result = run_fleet(trace, FleetConfig((ReplicaPool("replicas", num_replicas, sim),), router_config))
    assert result.figures.totals["invariant_violations"] == 0
    return result


def two_sessions() -> Trace:
    """Two sessions started together, turn 1 of P = 1,000 prompt and O = 40 output tokens each; turn 2 (16 new
    tokens) follows s1's answer after 0.1 s and s0's after 0.5 s, so s1's second turn is sent first."""
    sessions = [Session(name, (Turn(1000, 40), Turn(16, 8, delay_s=delay))) for name, delay in
                (("s0", 0.5), ("s1", 0.1))]
    return make_trace("two", [], source="test", sessions=sessions)


def turn_hits(result: FleetResult, trace: Trace) -> dict[str, tuple[int, int]]:
    """Per turn id: (the replica that ran it, its prompt tokens found cached)."""
    replica_of = {d.request: d.replica for d in result.decisions}
    return {r.id: (replica_of[i], result.arrivals.cached_tokens[i]) for i, r in enumerate(trace.requests)}


def test_session_affinity_sends_turn_two_where_turn_one_ran() -> None:
    # By hand: s0/0 and s1/0 arrive at 0; every replica ties (no session has an answer yet), s0/0 takes replica 0
    # (lowest index), s1/0 replica 1 (replica 0 now has one queued). Each turn 2 goes back where its turn 1 ran
    # and finds floor((P + O - 1) / 16) * 16 = floor(1039 / 16) * 16 = 1,024 tokens cached (the last generated
    # token's KV is never computed; 1,039 tokens are 64 full blocks and 15 over).
    trace = two_sessions()
    for router, weights in (("session-affinity", None), ("weighted", (("queue", 1.0), ("session", 5.0)))):
        sim = engine()
        result = run_fleet(trace, FleetConfig((ReplicaPool("replicas", 2, sim),), RouterConfig(router, weights=weights
                                                                                                   or ()),
                                              log_decisions=True))
        assert turn_hits(result, trace) == {"s0/0": (0, 0), "s1/0": (1, 0), "s0/1": (0, 1024), "s1/1": (1, 1024)}
        assert result.to_dict()["sessions"]["hit_pct_by_turn"] == [0.0, pytest.approx(100 * 1024 / 1056)]


def test_round_robin_sends_turn_two_elsewhere_and_misses() -> None:
    # By hand: round-robin sends s0/0 to 0 and s1/0 to 1; s1's turn 2 is sent first (0.1 s after its answer):
    # the third request, replica 0, which never saw s1; s0's turn 2 then goes to replica 1. Both find nothing.
    trace = two_sessions()
    result = run_fleet(trace, FleetConfig((ReplicaPool("replicas", 2, engine()),), RouterConfig("round-robin"),
                                          log_decisions=True))
    assert turn_hits(result, trace) == {"s0/0": (0, 0), "s1/0": (1, 0), "s0/1": (1, 0), "s1/1": (0, 0)}


def test_one_client_over_three_replicas_runs_one_request_at_a_time() -> None:
    trace = random_requests(25, seed=1)
    result = replay(trace, 3, clients=Clients(concurrency=1))
    arrivals, totals = result.arrivals, result.figures.totals
    e2e = [finish - sent for finish, sent in zip(arrivals.finish_s, arrivals.sent_s, strict=True)]
    assert arrivals.sent_s[0] == trace.requests[0].arrival_s
    assert all(arrivals.sent_s[i + 1] == arrivals.finish_s[i] for i in range(24))  # in trace order, none waiting
    assert [row["num_requests"] for row in result.figures.replicas] == [9, 8, 8]  # (round-robin: all used)
    assert totals["max_batch_size"] == 1 and arrivals.max_in_flight == 1
    assert totals["makespan_s"] == pytest.approx(sum(e2e), abs=1e-6)
    assert totals["mean_e2e_s"] == pytest.approx(np.mean(e2e), abs=1e-6)


@pytest.mark.parametrize("sessions", [False, True])
@pytest.mark.parametrize("router", ["round-robin", "prefix-aware", "weighted"])
def test_a_cap_above_the_number_of_requests_is_the_open_loop(sessions: bool, router: str) -> None:
    trace = generated() if sessions else random_requests(40, seed=2)
    open_loop = replay(trace, 3, router, num_blocks=60).to_dict()
    capped = replay(trace, 3, router, Clients(max_concurrency=trace.num_requests), num_blocks=60).to_dict()
    assert capped.pop("sessions")["mean_client_wait_s"] == 0.0
    open_loop.pop("sessions", None)
    assert capped == open_loop


@pytest.mark.parametrize("clients", [Clients(concurrency=3), Clients(max_concurrency=4), OPEN_LOOP])
def test_one_replica_is_simulate_with_sessions(clients: Clients) -> None:
    """Every field of ``simulate``'s metrics and its sessions object (60 blocks: preemptions)."""
    trace, sim = generated(), engine(clients, num_blocks=60)
    expected = simulate(trace, sim, ("paged",)).strategies["paged"].to_dict()
    document = replay(trace, 1, "session-affinity", clients, num_blocks=60).to_dict()
    assert document["sessions"] == expected.pop("sessions")
    assert {key: document["replicas"][0][key] for key in expected} == expected


def test_a_rejected_turn_ends_its_session() -> None:
    # A history that outgrows the model's length (200 tokens): turn 2's prompt is 120 + 50 + 40 = 210, refused;
    # turn 3 is never sent. The other session runs on.
    sessions = [Session("long", (Turn(120, 50), Turn(40, 5), Turn(10, 5))), Session("short", (Turn(20, 5),
                                                                                              Turn(10, 5)))]
    trace = make_trace("r", [], source="test", sessions=sessions)
    result = replay(trace, 2, "session-affinity", Clients(concurrency=2), max_model_len=200)
    document = result.to_dict()["sessions"]
    assert (document["turns_completed"], document["turns_rejected"], document["turns_not_sent"]) == (3, 1, 1)
    assert document["completed_sessions"] == 1


@settings(max_examples=30, deadline=None)
@given(sessions_and_clients(), st.integers(1, 3), st.sampled_from(["round-robin", "least-loaded", "prefix-aware",
                                                                   "session-affinity", "weighted"]),
       st.sampled_from([12, 40, 400]))
def test_every_turn_finishes_once_in_order_never_before_what_it_waits_for(
        case: tuple[Trace, Clients], num_replicas: int, router: str, num_blocks: int) -> None:
    trace, clients = case
    # (a pool that holds no request at all is refused before the replay, as simulate refuses it)
    assume(min(r.total_tokens for r in trace.requests) <= 4 * num_blocks)
    weights = (("prefix", 2.0), ("queue", 1.0), ("kv", 1.0), ("session", 3.0)) if router == "weighted" else None
    result = replay(trace, num_replicas, router, clients, weights, num_blocks=num_blocks, block_size=4)
    arrivals, totals = result.arrivals, result.figures.totals
    sent = [not np.isnan(t) for t in arrivals.sent_s]
    # Each request finished once (``Arrivals.finished`` asserts it), or was never sent after a rejected one.
    assert sum(not np.isnan(t) for t in arrivals.finish_s) == sum(sent) == trace.num_requests - arrivals.num_not_sent
    assert totals["completed_requests"] + totals["rejected_requests"] == sum(sent)
    assert sum(row["num_requests"] for row in result.figures.replicas) == sum(sent)
    if num_blocks == 400:
        assert all(arrivals.completed)
    position = {r.id: i for i, r in enumerate(trace.requests)}
    for request_id, link in trace.turns.items():
        index = position[request_id]
        if not sent[index]:
            assert any(not arrivals.completed[position[earlier]] or not sent[position[earlier]]
                       for earlier in link.after)
            continue
        for earlier in link.after:
            done = arrivals.finish_s[position[earlier]]
            assert arrivals.completed[position[earlier]]
            assert arrivals.sent_s[index] >= done + link.delay_s - 1e-12
            assert arrivals.finish_s[index] > done or not arrivals.completed[index]  # (refused on arrival)
    if clients.max_concurrency is not None:
        assert arrivals.max_in_flight <= clients.max_concurrency


def test_sessions_under_prefill_decode_disaggregation() -> None:
    # A turn is done when its decode replica has its last token: the next turn of the two-session case goes out
    # only then. Its prefix hit is its prefill replica's, which ran turn 1's prompt but not its answer (decoded on
    # the other side): floor(1000 / 16) * 16 = 992 tokens, not the 1,024 one engine finds.
    trace = two_sessions()
    sim = engine(Clients(concurrency=2))
    pools = (ReplicaPool("prefill", 1, sim, "prefill"), ReplicaPool("decode", 1, sim, "decode"))
    result = run_fleet(trace, FleetConfig(pools, RouterConfig("session-affinity"), KvLink(50e9, 20e-6)))
    arrivals, records = result.arrivals, result.records
    assert all(arrivals.completed)
    for index, record in enumerate(records):
        assert arrivals.finish_s[index] == record.finish_s > record.landed_s
    position = {r.id: i for i, r in enumerate(trace.requests)}
    for session, delay in (("s0", 0.5), ("s1", 0.1)):
        first, second = position[f"{session}/0"], position[f"{session}/1"]
        assert arrivals.sent_s[second] == pytest.approx(arrivals.finish_s[first] + delay)
        assert arrivals.cached_tokens[second] == 992



@pytest.mark.parametrize("delay", [0.0, 0.0025])
def test_a_turn_sent_to_a_replica_in_a_long_decode_joins_its_next_step(delay: float) -> None:
    # By hand (every step 1 ms): round-robin sends A (100 output tokens) to replica 0 and s/0 to replica 1; s/0
    # answers at 5 ms (a prefill step, then 4 decodes), and s/1 goes at once to replica 0, in the middle of A's
    # decode. Replica 0 must not have run its decode ahead in bulk past 5 ms: s/1 joins the step that starts at
    # 5 ms and has its first token at 6 ms (a bulk advance to A's end would give it about 95 ms). With a think
    # time of 2.5 ms it is sent at 7.5 ms, mid-step, and joins the step that starts at 8 ms: first token at 9 ms.
    trace = make_trace("t", [Request("A", 0.0, 10, 100)], source="test",
                       sessions=[Session("s", (Turn(10, 5), Turn(10, 5, delay_s=delay)))])
    result = run_fleet(trace, FleetConfig((ReplicaPool("replicas", 2, engine()),), log_decisions=True))
    position = {r.id: i for i, r in enumerate(trace.requests)}
    assert [(d.request, d.replica) for d in result.decisions] == [(position["A"], 0), (position["s/0"], 1),
                                                                  (position["s/1"], 0)]
    second = result.records[position["s/1"]]
    assert second.arrival_s == pytest.approx(0.005 + delay)
    assert second.first_token_s == pytest.approx(0.006 if delay == 0 else 0.009)
