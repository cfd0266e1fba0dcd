"""A fleet's replay: the trace's requests, sent by its clients (``sim/clients.py``: open loop, closed loop, capped;
sessions' turns when what they wait for has finished), routed over pools of replicas on one clock (``clock.py``),
with P/D transfers (``disaggregation.py``) and a shared KV store (``shared_store.py``); ``FleetResult`` is what it
measured."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from minipaged_cli.fleet.clock import FleetClock
from minipaged_cli.fleet.config import FleetConfig
from minipaged_cli.fleet.disaggregation import KvTransfers, RemoteKv, transfer_bytes
from minipaged_cli.fleet.prompt_keys import PromptKeys
from minipaged_cli.fleet.replica import Replica
from minipaged_cli.fleet.report import FleetFigures, RequestRecord, fleet_figures, makespan_s
from minipaged_cli.fleet.routers import Decision, Router
from minipaged_cli.fleet.shared_store import share_tiers
from minipaged_cli.sim.clients import Arrivals
from minipaged_cli.sim.private_keys import shared_segments
from minipaged_cli.sim.replay import check_capacity
from minipaged_cli.sim.session_report import session_metrics
from minipaged_cli.workloads.trace import Request, Trace

SEND, DONE, LAND = "send", "done", "land"  # the clock's events (``Fleet.run``)


@dataclass
class FleetResult:
    """Per replica its ``simulate`` metrics; the fleet's totals; the router's decisions when logged."""

    trace: Trace
    fleet: FleetConfig
    replicas: list[Replica]
    figures: FleetFigures
    transfers: KvTransfers | None = None
    decisions: list[Decision] = field(default_factory=list)
    router: dict[str, int] = field(default_factory=dict)  # the routers' own figures (``Router.figures``)
    records: list[RequestRecord] = field(default_factory=list, repr=False)  # per request of the trace
    arrivals: Arrivals | None = field(default=None, repr=False)  # the clients: when each was sent, finished

    def to_dict(self) -> dict[str, Any]:
        return self.figures.to_dict(self.fleet, self.transfers, self.decisions, self.router)


class Fleet:
    """The replicas of every pool, their routers, the P/D link, the clients; ``run`` replays a trace over them.

    The clients are ``simulate``'s (``sim.clients.Arrivals``), driven by the fleet's clock: a request is sent (and
    routed) when they send it, and they hear a request is done when the replica that ran it finished or refused
    it (under P/D, its decode), at that moment on the fleet's clock, so a session's next turn, a closed-loop
    client's next request or a capped client's queued one is sent then, plus its delay.
    """

    def __init__(self, trace: Trace, fleet: FleetConfig) -> None:
        self.trace = trace
        self.config = fleet
        self.arrivals = Arrivals(trace, fleet.clients)
        # A finish may send a request: the clock must not let a replica run past it (``clock.py``), and the
        # clients hear it at its moment on the clock. Otherwise they hear it as soon as it is known, which leaves
        # the replicas' bulk advances whole.
        self.reacts = self.arrivals.min_reaction_s < math.inf
        # A router that reads nothing (round-robin), clients that send each request at its arrival, and nothing
        # else passing between replicas (no P/D, no shared KV store): every request is routed before the replays
        # start (``run``), and each replica replays its own requests as ``simulate`` does, its bulk advances cut by
        # nothing else. (Not with a timeline, a point per pass: its plot would have fewer points.)
        self.routes_ahead = not (fleet.router.reads_replicas or self.reacts or fleet.disaggregated
                                 or fleet.shared_kv_store or fleet.record_timeline)
        self.replicas: list[Replica] = []
        pools: dict[str, list[Replica]] = {}
        shared = shared_segments(trace.requests)
        for pool in fleet.pools:
            check_capacity(trace, pool.config, ("paged",))
            for _ in range(pool.num_replicas):
                replica = Replica(len(self.replicas), pool.config, trace.segments, trace.num_requests,
                                  role=pool.role, kv_events=fleet.router.reads_prefixes
                                  and fleet.router.prefix_index == "precise", record_timeline=fleet.record_timeline,
                                  read_by_router=fleet.router.reads_replicas, shared_segments=shared)
                self.replicas.append(replica)
                pools.setdefault(pool.role, []).append(replica)
        if fleet.shared_kv_store:
            share_tiers(self.replicas)
        self.transfers = KvTransfers(fleet.kv_link) if fleet.kv_link is not None and fleet.disaggregated else None
        self.entry = Router(fleet.router, pools.get("mixed") or pools["prefill"])
        self.decode = Router(fleet.router, pools["decode"]) if fleet.disaggregated else None
        if self.decode is not None:
            for replica in self.decode.replicas:
                replica.replay.scheduler.tiers = RemoteKv(fleet.prefill_threshold)  # type: ignore[assignment]
        self.decisions: list[Decision] = []
        self.records = [RequestRecord(r.arrival_s, r.output_tokens) for r in trace.requests]
        self.sessions = [link.session if (link := trace.turns.get(r.id)) else None for r in trace.requests]
        self.routed: list[list[tuple[Router, Replica]]] = [[] for _ in trace.requests]  # (P/D: entry, decode)
        self.prompt_cached: dict[int, int] = {}  # P/D: the prefix hit of a prompt its prefill replica ran
        # A prefill's KV lands at its decode side no sooner than the link's latency after it: the clock must not
        # let a decode replica run past a landing either
        landing_s = self.transfers.latency_s if self.transfers is not None else math.inf
        self.clock = FleetClock(self.replicas, reaction_s=self.arrivals.min_reaction_s, landing_s=landing_s,
                                bound_finishes=not fleet.router.reads_replicas)
        self.arrivals_at = math.inf  # when the clock's pending "send" event is
        self.lazy_keys = True  # a router builds a prompt's keys as far as its lookups reach (``prompt_keys.py``)

    def run(self) -> FleetResult:
        """At each moment on the clock: the clients hear what finished then, send what is due (each routed at
        once, in the order sent; all at the start where the routing reads nothing the replays change,
        ``routes_ahead``), then prefills' KV landing then reaches the decode side. Event payloads:
        ``(SEND,)``, ``(DONE, index, completed, cached tokens)``, ``(LAND, index)``."""
        clock = self.clock
        if self.routes_ahead:  # (the clients send every request at its arrival: none is left to send later)
            for index, request in self.arrivals.due(math.inf):
                self.records[index].arrival_s = request.arrival_s
                self._route(index, request, request.arrival_s)
            for replica in self.replicas:
                replica.sent_all()
        self._schedule_send()
        while True:
            clock.advance(self._finished)
            at, due = clock.pop_due()
            if not due:
                break
            if at >= self.arrivals_at:
                self.arrivals_at = math.inf
            for event in due:
                if event[0] == DONE:
                    self._client_done(*event[1:], at)
            for index, request in self.arrivals.due(at):
                self.records[index].arrival_s = request.arrival_s
                self._route(index, request, at)
            for event in due:
                if event[0] == LAND:
                    self._land(event[1], at)
            self._schedule_send()
        assert not self.arrivals.has_pending, "a request was never sent: the clients missed a finish"
        routers = [self.entry] if self.decode is None else [self.entry, self.decode]
        figures = {name: sum(router.figures().get(name, 0) for router in routers)
                   for name in self.entry.figures()}
        figures_of = fleet_figures(self.replicas, self.records, self.transfers)
        if self.trace.sessions or self.config.clients.kind != "open":
            figures_of.sessions = session_metrics(self.trace, self.arrivals, self.config.clients,
                                                  makespan_s(self.records))
        return FleetResult(self.trace, self.config, self.replicas, figures_of, self.transfers,
                           self.decisions, figures, self.records, self.arrivals)

    def _schedule_send(self) -> None:
        """Put the clients' next send on the clock (once: an earlier one replaces a later one in effect)."""
        next_s = self.arrivals.next_arrival_s
        if next_s is not None and next_s < self.arrivals_at:
            self.clock.schedule(next_s, (SEND,))
            self.arrivals_at = next_s

    def _route(self, fleet_index: int, request: Request, at: float) -> None:
        local = self.decode is not None and request.prompt_tokens <= self.config.prefill_threshold
        router = self.decode if local else self.entry
        replica = self._choose(router, fleet_index, at)
        if self.decode is not None and not local and request.output_tokens > 1:
            # The prefill replica runs the prompt and samples one token; the decode replica the rest.
            request = replace(request, output_tokens=1, n=1)
        replica.send(request, fleet_index, at)

    def _choose(self, router: Router, fleet_index: int, at: float) -> Replica:
        keys = PromptKeys(self.trace.requests[fleet_index], fleet_index, self.trace.segments,
                          router.replicas[0].config.block_size, lazy=self.lazy_keys) \
            if router.needs_block_hashes else None
        if self.config.log_decisions:
            replica, decision = router.choose(fleet_index, keys, at, self.sessions[fleet_index])
            self.decisions.append(decision)
        else:
            replica = router.route(fleet_index, keys, at, self.sessions[fleet_index])
        self.routed[fleet_index].append((router, replica))
        return replica

    def _finished(self, replica: Replica) -> None:
        """After a replica's pass: note what finished; a prefill replica's finished prompts start their transfers;
        the clients hear what is done when the clock reaches its finish."""
        for live, finish_s in replica.take_finished():
            fleet_index = replica.fleet_indices[live.request_index]
            record = self.records[fleet_index]
            if replica.role == "prefill" and record.output_tokens > 1:
                record.prefilled_s = finish_s
                num_bytes = transfer_bytes(replica.config, live.prompt_tokens)
                self.clock.schedule(self.transfers.send(num_bytes, finish_s), (LAND, fleet_index))
                continue
            record.finished(live, finish_s)
        for fleet_index, now, completed, cached in replica.take_done():
            if replica.role == "prefill" and completed and self.records[fleet_index].output_tokens > 1:
                self.prompt_cached[fleet_index] = cached  # (its decode replica finishes it)
                continue
            cached = self.prompt_cached.pop(fleet_index, cached)
            if self.reacts:
                self.clock.schedule(now, (DONE, fleet_index, completed, cached))
            else:
                self._client_done(fleet_index, completed, cached, now)

    def _client_done(self, fleet_index: int, completed: bool, cached_tokens: int, at: float) -> None:
        """Request ``fleet_index`` is done: its clients hear it; its session's cookie names who answered."""
        self.arrivals.finished(fleet_index, at, completed=completed, cached_tokens=cached_tokens)
        session = self.sessions[fleet_index]
        if completed and session is not None:
            for router, replica in self.routed[fleet_index]:
                router.served(session, replica)

    def _land(self, fleet_index: int, at: float) -> None:
        """A prefill's KV has landed: the request reaches a decode replica."""
        self.records[fleet_index].landed_s = at
        replica = self._choose(self.decode, fleet_index, at)
        replica.send(self.trace.requests[fleet_index], fleet_index, at)


def run_fleet(trace: Trace, fleet: FleetConfig) -> FleetResult:
    """Replay ``trace`` over ``fleet``."""
    return Fleet(trace, fleet).run()
