"""What the clients saw (``sim/clients.py``): per session, its duration; per turn index, the prefix cache's hit
rate (turn 0 against later turns: whether the cache holds conversations); turns per second; under a cap, the
time requests waited in the client before they were sent (beside TTFT, which counts from the send)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from minipaged_cli.sim.clients import Arrivals, Clients
from minipaged_cli.sim.latencies import percentile
from minipaged_cli.units import rounded
from minipaged_cli.workloads.trace import Trace


@dataclass(frozen=True)
class SessionMetrics:
    """Sessions and clients of one replay. Durations in seconds; hit rates in % of prompt tokens looked up.

    A session's duration runs from its first turn's send to its last turn's finish, over sessions whose every turn
    completed. ``hit_pct_by_turn[i]``: turn index i (0 the first) over completed turns.
    """

    clients: str
    concurrency: int | None
    num_sessions: int
    completed_sessions: int
    turns_completed: int
    turns_rejected: int
    turns_not_sent: int  # after a rejected turn: the session ended there
    turns_per_s: float
    mean_session_s: float | None
    p99_session_s: float | None
    hit_pct_first_turn: float | None
    hit_pct_later_turns: float | None
    hit_pct_by_turn: list[float]
    mean_client_wait_s: float
    p99_client_wait_s: float
    max_in_flight: int | None

    def to_dict(self) -> dict[str, object]:
        return rounded(asdict(self))


def session_metrics(trace: Trace, arrivals: Arrivals, clients: Clients, makespan_s: float) -> SessionMetrics:
    requests = trace.requests
    position = {r.id: i for i, r in enumerate(requests)}
    queries: dict[int, int] = {}
    hits: dict[int, int] = {}
    durations = []
    completed_sessions = turns_completed = turns_rejected = 0
    for session in trace.sessions:
        members = [position[session.turn_id(i)] for i in range(len(session.turns))]
        for turn, index in enumerate(members):
            if arrivals.completed[index]:
                turns_completed += 1
                queries[turn] = queries.get(turn, 0) + requests[index].prompt_tokens
                hits[turn] = hits.get(turn, 0) + arrivals.cached_tokens[index]
            elif not math.isnan(arrivals.finish_s[index]):
                turns_rejected += 1
        if all(arrivals.completed[i] for i in members):
            completed_sessions += 1
            durations.append(max(arrivals.finish_s[i] for i in members) - min(arrivals.sent_s[i] for i in members))
    later_queries = sum(q for turn, q in queries.items() if turn)
    waits = [sent - due for sent, due in zip(arrivals.sent_s, arrivals.due_s, strict=True) if not math.isnan(sent)]
    concurrency = clients.concurrency if clients.concurrency is not None else clients.max_concurrency
    return SessionMetrics(
        clients=clients.kind,
        concurrency=concurrency,
        num_sessions=len(trace.sessions),
        completed_sessions=completed_sessions,
        turns_completed=turns_completed,
        turns_rejected=turns_rejected,
        turns_not_sent=arrivals.num_not_sent,
        turns_per_s=turns_completed / makespan_s if makespan_s > 0 else 0.0,
        mean_session_s=float(np.mean(durations)) if durations else None,
        p99_session_s=percentile(durations, 99) if durations else None,
        hit_pct_first_turn=100.0 * hits[0] / queries[0] if queries.get(0) else None,
        hit_pct_later_turns=100.0 * sum(h for turn, h in hits.items() if turn) / later_queries
        if later_queries else None,
        hit_pct_by_turn=[100.0 * hits[turn] / queries[turn] for turn in sorted(queries)],
        mean_client_wait_s=float(np.mean(waits)) if waits else 0.0,
        p99_client_wait_s=percentile(waits, 99) if waits else 0.0,
        max_in_flight=arrivals.max_in_flight if clients.kind != "open" else None,
    )
