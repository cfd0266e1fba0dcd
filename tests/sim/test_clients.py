"""Clients (``sim/clients.py``): a closed loop of one client runs requests strictly one after another; a cap no
lower than the number of requests changes nothing; a cap's wait is measured in the client, not in TTFT; and
nothing is lost: every turn finishes once, never before what it waits for (a property over random sessions)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.errors import InputError
from minipaged_cli.sim.clients import Clients
from minipaged_cli.workloads.sessions import Session, Turn
from minipaged_cli.workloads.trace import Request, Trace, make_trace
from tests.session_helpers import run
from tests.workloads.test_sessions import generated


def random_requests(count: int, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    requests = [Request(f"r{i}", float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.sort(rng.uniform(0, 0.05, count)), rng.integers(5, 400, count), rng.integers(1, 80, count), strict=True))]
    return make_trace("r", requests, source="test")


def test_one_client_runs_requests_one_after_another() -> None:
    trace = random_requests(25, seed=1)
    metrics, clients = run(trace, clients=Clients(concurrency=1))
    e2e = [finish - sent for finish, sent in zip(clients.finish_s, clients.sent_s, strict=True)]
    assert clients.sent_s[0] == trace.requests[0].arrival_s
    assert all(clients.sent_s[i + 1] == clients.finish_s[i] for i in range(24))  # in trace order, none waiting
    assert metrics.max_batch_size == 1 and clients.max_in_flight == 1
    assert metrics.makespan_s == pytest.approx(sum(e2e))
    assert metrics.mean_e2e_s == pytest.approx(np.mean(e2e))


@pytest.mark.parametrize("scheduler", ["v0", "v1"])
def test_a_rejected_request_of_several_samples_frees_its_client(scheduler: str) -> None:
    # Under v0 a request's other samples are forked after its prefill: rejected before that (longer than the
    # model), they never run, and its one client must still hear it is done, or the closed loop waits forever.
    requests = [Request("a", 0.0, 100, 10, n=2), Request("long", 0.1, 5000, 10, n=2), Request("c", 0.2, 100, 10)]
    metrics, clients = run(make_trace("r", requests, source="test"), clients=Clients(concurrency=1),
                           scheduler=scheduler, max_model_len=4096)
    assert (metrics.completed_requests, metrics.rejected_requests) == (2, 1)
    assert clients.sent_s[2] == clients.finish_s[1]  # c went out when the rejection freed the client


@pytest.mark.parametrize("sessions", [False, True])
def test_a_cap_above_the_number_of_requests_is_the_open_loop(sessions: bool) -> None:
    trace = generated() if sessions else random_requests(40, seed=2)
    open_loop, _ = run(trace, num_blocks=60)
    capped, _ = run(trace, num_blocks=60, clients=Clients(max_concurrency=trace.num_requests))
    assert open_loop.measurements() == capped.measurements()
    assert capped.sessions.mean_client_wait_s == 0.0 and capped.sessions.clients == "capped"


def test_a_cap_of_one_waits_in_the_client_not_in_ttft() -> None:
    # Three requests at t = 0 of 10 + 5 tokens: 1 prefill step + 4 decodes of 1 ms each. One at a time, they are
    # sent at 0, 5 and 10 ms: waits 0, 5, 10 ms; each TTFT (from its send) is its prefill's 1 ms.
    trace = make_trace("t", [Request(f"r{i}", 0.0, 10, 5) for i in range(3)], source="test")
    metrics, clients = run(trace, clients=Clients(max_concurrency=1))
    assert clients.sent_s == pytest.approx([0.0, 0.005, 0.010])
    assert metrics.sessions.mean_client_wait_s == pytest.approx(0.005)
    assert metrics.sessions.max_in_flight == 1
    assert metrics.mean_ttft_s == pytest.approx(0.001)
    assert metrics.makespan_s == pytest.approx(0.015)


def test_concurrency_counts_sessions_not_turns() -> None:
    # Two clients, three sessions of two turns: the third session starts when the first one's last turn is done.
    sessions = [Session(f"s{i}", (Turn(20, 3), Turn(5, 3, delay_s=0.01))) for i in range(3)]
    trace = make_trace("t", [], source="test", sessions=sessions)
    _, clients = run(trace, clients=Clients(concurrency=2))
    position = {r.id: i for i, r in enumerate(trace.requests)}
    first_done = min(clients.finish_s[position[f"s{i}/1"]] for i in range(2))
    assert clients.sent_s[position["s2/0"]] == first_done


def test_both_caps_at_once_are_refused() -> None:
    with pytest.raises(InputError, match="not both"):
        Clients(concurrency=2, max_concurrency=3)
    with pytest.raises(InputError, match="concurrency: 0: must be a whole number >= 1"):
        Clients(concurrency=0)


@st.composite
def sessions_and_clients(draw: st.DrawFn) -> tuple[Trace, Clients]:
    sessions = []
    for number in range(draw(st.integers(1, 5))):
        turns = []
        for index in range(draw(st.integers(1, 5))):
            earlier = st.lists(st.integers(0, index - 1), min_size=1, max_size=3, unique=True) if index else st.just([])
            after = tuple(sorted(draw(earlier))) if draw(st.booleans()) else None
            turns.append(Turn(draw(st.integers(1, 60)), draw(st.integers(1, 20)),
                              delay_s=draw(st.sampled_from([0.0, 0.002, 0.01])), after=after))
        sessions.append(Session(f"s{number}", tuple(turns), start_s=draw(st.sampled_from([0.0, 0.003, 0.02]))))
    plain = [Request(f"r{i}", draw(st.sampled_from([0.0, 0.01])), draw(st.integers(1, 60)), draw(st.integers(1, 9)))
             for i in range(draw(st.integers(0, 3)))]
    limit = draw(st.integers(1, 4))
    clients = draw(st.sampled_from([Clients(), Clients(concurrency=limit), Clients(max_concurrency=limit)]))
    return make_trace("p", plain, source="test", sessions=sessions), clients


@settings(max_examples=40, deadline=None)
@given(sessions_and_clients(), st.sampled_from([12, 40, 400]))
def test_every_turn_finishes_once_in_order_never_before_what_it_waits_for(case: tuple[Trace, Clients],
                                                                         num_blocks: int) -> None:
    trace, clients = case
    metrics, arrivals = run(trace, clients=clients, num_blocks=num_blocks, block_size=4)
    # Each request finished once (``Arrivals.finished`` asserts it), or was never sent after a rejected one.
    sent = [not np.isnan(t) for t in arrivals.sent_s]
    assert sum(not np.isnan(t) for t in arrivals.finish_s) == sum(sent) == trace.num_requests - arrivals.num_not_sent
    assert metrics.completed_requests + metrics.rejected_requests == sum(sent)
    if num_blocks == 400:  # room for every history: nothing rejected
        assert all(arrivals.completed)
    position = {r.id: i for i, r in enumerate(trace.requests)}
    for request_id, link in trace.turns.items():
        index = position[request_id]
        if not sent[index]:
            assert any(not arrivals.completed[position[earlier]] for earlier in link.after) or \
                any(not sent[position[earlier]] for earlier in link.after)
            continue
        for earlier in link.after:
            assert arrivals.completed[position[earlier]]
            assert arrivals.sent_s[index] == pytest.approx(arrivals.finish_s[position[earlier]] + link.delay_s) \
                or arrivals.sent_s[index] > arrivals.finish_s[position[earlier]] + link.delay_s
    if clients.max_concurrency is not None:
        assert arrivals.max_in_flight <= clients.max_concurrency
    if clients.concurrency is not None:  # units (sessions, requests) active at once
        spans = {}
        for request in trace.requests:
            link = trace.turns.get(request.id)
            key = link.session if link else request.id
            i = position[request.id]
            start, end = spans.get(key, (np.inf, -np.inf))
            spans[key] = (min(start, arrivals.sent_s[i]), max(end, arrivals.finish_s[i]))
        for start, _ in spans.values():  # (a unit started at another's end does not overlap it)
            assert sum(s <= start < e for s, e in spans.values()) <= clients.concurrency
