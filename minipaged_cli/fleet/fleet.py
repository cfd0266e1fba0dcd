"""A fleet's replay: the trace routed over pools of replicas on one clock (``clock.py``), with P/D transfers
(``disaggregation.py``) and a shared KV store (``shared_store.py``); ``FleetResult`` is what it measured."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from minipaged_cli.errors import InputError
from minipaged_cli.fleet.clock import FleetClock
from minipaged_cli.fleet.config import FleetConfig
from minipaged_cli.fleet.disaggregation import KvTransfers, RemoteKv, transfer_bytes
from minipaged_cli.fleet.replica import Replica
from minipaged_cli.fleet.report import FleetFigures, RequestRecord, fleet_figures
from minipaged_cli.fleet.routers import Decision, Router
from minipaged_cli.fleet.shared_store import share_tiers
from minipaged_cli.sim.replay import check_capacity
from minipaged_cli.sim.scheduler import content_keys
from minipaged_cli.workloads.trace import Trace


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

    def to_dict(self) -> dict[str, Any]:
        return self.figures.to_dict(self.fleet, self.transfers, self.decisions, self.router)


class Fleet:
    """The replicas of every pool, their routers, the P/D link; ``run`` replays a trace over them."""

    def __init__(self, trace: Trace, fleet: FleetConfig) -> None:
        self.trace = trace
        self.config = fleet
        self.replicas: list[Replica] = []
        pools: dict[str, list[Replica]] = {}
        if trace.turns or any(pool.config.clients.kind != "open" for pool in fleet.pools):
            # a router sends each request at its time in the trace; turns sent when earlier ones finish are not yet
            raise InputError("a fleet replays requests at their arrival times: sessions and closed-loop or capped "
                             "clients run on one engine", field="{replicas}")
        for pool in fleet.pools:
            check_capacity(trace, pool.config, ("paged",))
            for _ in range(pool.num_replicas):
                replica = Replica(len(self.replicas), pool.config, trace.segments, trace.num_requests,
                                  role=pool.role, kv_events=fleet.router.reads_prefixes
                                  and fleet.router.prefix_index == "precise", record_timeline=fleet.record_timeline)
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
        self.clock = FleetClock(self.replicas)

    def run(self) -> FleetResult:
        """Arrivals join the clock one at a time (the next when one is routed); landings when their transfer is
        issued. Event payloads: a request's index (arrival), or -1 - index (its KV landing)."""
        requests, clock = self.trace.requests, self.clock
        clock.schedule(requests[0].arrival_s, 0)
        while True:
            clock.advance(self._finished)
            at, due = clock.pop_due()
            if not due:
                break
            for payload in due:
                if payload >= 0:  # every request arriving now, in trace order, before any replica steps
                    index = payload
                    while index < len(requests) and requests[index].arrival_s == at:
                        self._route(index, at)
                        index += 1
                    if index < len(requests):
                        clock.schedule(requests[index].arrival_s, index)
                else:
                    self._land(-payload - 1, at)
        routers = [self.entry] if self.decode is None else [self.entry, self.decode]
        figures = {name: sum(router.figures().get(name, 0) for router in routers)
                   for name in self.entry.figures()}
        return FleetResult(self.trace, self.config, self.replicas,
                           fleet_figures(self.replicas, self.records, self.transfers), self.transfers,
                           self.decisions, figures, self.records)

    def _route(self, fleet_index: int, at: float) -> None:
        request = self.trace.requests[fleet_index]
        local = self.decode is not None and request.prompt_tokens <= self.config.prefill_threshold
        router = self.decode if local else self.entry
        replica = self._choose(router, fleet_index, at)
        if self.decode is not None and not local and request.output_tokens > 1:
            # The prefill replica runs the prompt and samples one token; the decode replica the rest.
            request = replace(request, output_tokens=1, n=1)
        replica.send(request, fleet_index, at)

    def _choose(self, router: Router, fleet_index: int, at: float) -> Replica:
        request = self.trace.requests[fleet_index]
        block_size = router.replicas[0].config.block_size
        hashes = content_keys(request, fleet_index, 0, self.trace.segments, block_size)[
            :request.prompt_tokens // block_size] if router.needs_block_hashes else []
        replica, decision = router.choose(fleet_index, hashes, at)
        if self.config.log_decisions:
            self.decisions.append(decision)
        return replica

    def _finished(self, replica: Replica) -> None:
        """After a replica's pass: note what finished; a prefill replica's finished prompts start their transfers."""
        for live, finish_s in replica.take_finished():
            fleet_index = replica.fleet_indices[live.request_index]
            record = self.records[fleet_index]
            if replica.role == "prefill" and record.output_tokens > 1:
                record.prefilled_s = finish_s
                num_bytes = transfer_bytes(replica.config, live.prompt_tokens)
                self.clock.schedule(self.transfers.send(num_bytes, finish_s), -fleet_index - 1)
                continue
            record.finished(live, finish_s)

    def _land(self, fleet_index: int, at: float) -> None:
        """A prefill's KV has landed: the request reaches a decode replica."""
        self.records[fleet_index].landed_s = at
        replica = self._choose(self.decode, fleet_index, at)
        replica.send(self.trace.requests[fleet_index], fleet_index, at)


def run_fleet(trace: Trace, fleet: FleetConfig) -> FleetResult:
    """Replay ``trace`` over ``fleet``."""
    return Fleet(trace, fleet).run()
