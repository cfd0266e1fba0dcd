"""``simulate``'s bulk advances (``sim/bulk_advance.py``) against the same replay one step at a time on random session
and client workloads, decision for decision: on a clock of whole-millisecond steps a step end ties with a finish
plus a think time, and both paths must put the tie on the same side (the fleet's version: ``tests/fleet/
test_fleet_clock.py``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minipaged_cli.sim.clients import Clients
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay
from minipaged_cli.workloads.sessions import Session, Turn
from minipaged_cli.workloads.trace import Trace, make_trace
from tests.session_helpers import CLOCK_GPU, MODEL
from tests.sim.test_clients import sessions_and_clients


def replay(trace: Trace, config: SimConfig, *, bulk: bool) -> Replay:
    replay = Replay(trace, config, config.allocator("paged"), bulk, None)
    assert replay.run().invariant_violations == 0
    return replay


def assert_same_replay(trace: Trace, config: SimConfig) -> None:
    """The same sends, hits, finishes and first tokens (to 1e-9 s: a bulk advance integrates its metrics in another
    order, but its clock adds the same step times), the same number of steps and preemptions."""
    fast, naive = replay(trace, config, bulk=True), replay(trace, config, bulk=False)
    one, other = fast.scheduler.arrivals, naive.scheduler.arrivals
    assert one.completed == other.completed and one.cached_tokens == other.cached_tokens
    for name in ("sent_s", "finish_s"):
        np.testing.assert_allclose(getattr(one, name), getattr(other, name), rtol=0, atol=1e-9, err_msg=name)
    np.testing.assert_allclose(np.frombuffer(fast.accounting.latencies.ttft_s),
                               np.frombuffer(naive.accounting.latencies.ttft_s), rtol=0, atol=1e-9)
    assert fast.accounting.num_steps == naive.accounting.num_steps
    metrics, reference = fast.metrics(), naive.metrics()
    assert (metrics.num_preemptions, metrics.prefix_cache_hits) == (reference.num_preemptions,
                                                                    reference.prefix_cache_hits)


def engine(clients: Clients, num_blocks: int, step_s: float) -> SimConfig:
    return SimConfig.of(MODEL, replace(CLOCK_GPU, step_overhead_s=step_s), num_blocks, block_size=4,
                        check_invariants=True, clients=clients)


def test_a_turn_released_on_a_step_end_of_a_bulk_advance() -> None:
    # By hand (every step 1 ms): s2/0 answers at 4 ms, and s2/1 is due 10 ms later, at 0.004 + 0.01 = 0.014 in
    # floats. s0/0 (3 output tokens) runs 10-13 ms: a prefill step, then two decodes, which a bulk advance takes
    # at once; s0/1 to s0/3 follow one a step. One step at a time the clock reads 0.011 + 0.001 + 0.001 =
    # 0.013000000000000001 at s0/0's end, and 0.014000000000000002 when s0/1 answers: after s2/1 was sent, so
    # s2/1 joins s0/2's step. A bulk advance adding its 2 ms at once reads 0.013 and then 0.013999999999999999,
    # before s2/1, and sent s0/2 first.
    sessions = [Session("s0", (Turn(1, 3, delay_s=0.01), Turn(1, 1), Turn(1, 1), Turn(1, 1))),
                Session("s1", (Turn(1, 1),)), Session("s2", (Turn(1, 1), Turn(1, 1, delay_s=0.01)), start_s=0.003)]
    trace = make_trace("p", [], source="test", sessions=sessions)
    config = engine(Clients(), 12, 0.001)
    position = {r.id: i for i, r in enumerate(trace.requests)}
    sent = replay(trace, config, bulk=True).scheduler.arrivals.sent_s
    assert sent[position["s2/1"]] < sent[position["s0/2"]]
    assert_same_replay(trace, config)


@settings(max_examples=60, deadline=None)
@given(sessions_and_clients(), st.sampled_from([12, 40, 400]), st.sampled_from([0.001, 0.000937]))
def test_sessions_and_clients_in_bulk_are_the_naive_replay(case: tuple[Trace, Clients], num_blocks: int,
                                                           step_s: float) -> None:
    trace, clients = case
    assume(min(r.total_tokens for r in trace.requests) <= 4 * num_blocks)
    assert_same_replay(trace, engine(clients, num_blocks, step_s))
