"""What a fleet's replay measured: each replica's ``simulate`` metrics (the same field names), and the fleet's
totals under those names again, from each request's own record (its arrival at the fleet, first token, last
token: TTFT under P/D runs from the arrival at the prefill replica to the decode replica's first token).

Totals: counts summed; memory percentages averaged over the replicas weighted by their KV capacity (the peak: the
highest); latencies over every request of the fleet; throughput the fleet's output tokens over its makespan;
``imbalance`` the most requests a replica was sent over the mean. Under P/D both pools look their prompts up, so
the prefix-cache counters hold both lookups; a replica's own row measures from a request's arrival there (a decode
replica's TTFT from the transfer's landing, a prefill replica's from the fleet's arrival to its prefill's end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from minipaged_cli.sim.accounting import StrategyMetrics
from minipaged_cli.sim.latencies import percentile
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.session_report import SessionMetrics
from minipaged_cli.units import rounded

if TYPE_CHECKING:
    from minipaged_cli.fleet.config import FleetConfig
    from minipaged_cli.fleet.disaggregation import KvTransfers
    from minipaged_cli.fleet.replica import Replica
    from minipaged_cli.fleet.routers import Decision

_WEIGHTED = ("token_state_pct", "reserved_future_pct", "internal_frag_pct", "external_frag_pct", "free_pct",
             "kv_cache_usage_perc")
_SUMMED = ("rejected_requests", "num_preemptions", "prefix_cache_queries", "prefix_cache_hits", "num_evictions",
           "num_copy_on_writes", "num_swaps", "swap_out_bytes", "swap_in_bytes", "invariant_violations")
_TIER_SUMMED = ("hit_tokens", "recomputed_tokens", "stored_bytes", "loaded_bytes", "dropped_stores")


@dataclass
class RequestRecord:
    """One request of the fleet's trace, as the fleet saw it (times in seconds on the fleet's clock)."""

    arrival_s: float
    output_tokens: int
    first_token_s: float | None = None
    finish_s: float | None = None
    prefilled_s: float | None = None  # P/D: its prefill replica finished the prompt
    landed_s: float | None = None  # P/D: its KV reached the decode side
    num_finished: int = 0  # its sequences that finished (its samples; P/D: on the decode side)

    def finished(self, live: LiveRequest, finish_s: float) -> None:
        """One of its sequences finished (the last of its samples ends the request)."""
        self.num_finished += 1
        if live.sample == 0:
            self.first_token_s = live.first_token_s
        self.finish_s = finish_s if self.finish_s is None else max(self.finish_s, finish_s)


def makespan_s(records: Sequence[RequestRecord]) -> float:
    """From the first request's arrival to the last finish."""
    first_arrival = records[0].arrival_s
    return max((r.finish_s for r in records if r.finish_s is not None), default=first_arrival) - first_arrival


def latency_figures(ttfts: Sequence[float], tpots: Sequence[float]) -> dict[str, float | None]:
    """p50/p99 of TTFT and TPOT (None when there is none), beside ``simulate``'s means."""
    def pct(values: Sequence[float], q: float) -> float | None:
        return percentile(values, q) if len(values) else None

    return {"p50_ttft_s": pct(ttfts, 50), "p50_tpot_s": pct(tpots, 50), "p99_tpot_s": pct(tpots, 99)}


@dataclass
class FleetFigures:
    """Per replica (``simulate``'s fields, plus its role, engine, requests and latency percentiles), the totals,
    and with sessions or clients other than open loop what the clients saw (``sim.session_report``)."""

    replicas: list[dict[str, Any]]
    totals: dict[str, Any]
    sessions: SessionMetrics | None = None

    def to_dict(self, fleet: FleetConfig, transfers: KvTransfers | None, decisions: list[Decision],
                router: dict[str, int]) -> dict[str, Any]:
        document: dict[str, Any] = {"num_replicas": fleet.num_replicas, "router": {**fleet.router.to_dict(), **router},
                                    "shared_kv_store": fleet.shared_kv_store, "replicas": self.replicas,
                                    **self.totals}
        if transfers is not None:
            document["kv_link"] = {**transfers.to_dict(self.totals["makespan_s"]),
                                   "prefill_threshold": fleet.prefill_threshold}
        if self.sessions is not None:
            document["sessions"] = self.sessions.to_dict()
        if decisions:
            document["decisions"] = [d.to_dict() for d in decisions]
        return document


def fleet_figures(replicas: list[Replica], records: list[RequestRecord],
                  transfers: KvTransfers | None) -> FleetFigures:
    metrics = [replica.metrics() for replica in replicas]
    rows = []
    for replica, m in zip(replicas, metrics, strict=True):
        latencies = replica.replay.accounting.latencies  # (from each request's arrival at the replica)
        ttfts, tpots = latencies.ttft_s, latencies.tpot_s
        rows.append({"replica": replica.index, "role": replica.role, "model": replica.config.model.name,
                     "gpu": replica.config.gpu.name, "num_blocks": replica.config.cache.num_blocks,
                     "num_requests": len(replica.requests),
                     **m.to_dict(), **rounded(latency_figures(ttfts, tpots))})
    return FleetFigures(rows, _totals(replicas, metrics, records, transfers))


def _totals(replicas: list[Replica], metrics: list[StrategyMetrics], records: list[RequestRecord],
            transfers: KvTransfers | None) -> dict[str, Any]:
    done = [r for r in records if r.finish_s is not None]
    ttfts = [r.first_token_s - r.arrival_s for r in done if r.first_token_s is not None]
    tpots = [(r.finish_s - r.first_token_s) / (r.output_tokens - 1) for r in done
             if r.output_tokens > 1 and r.first_token_s is not None]
    e2e = [r.finish_s - r.arrival_s for r in done]
    normalized = [(r.finish_s - r.arrival_s) / r.output_tokens for r in done]
    makespan = makespan_s(records)
    capacities = np.array([replica.replay.allocator.capacity_tokens for replica in replicas], dtype=float)
    totals: dict[str, Any] = {
        name: float(np.average([getattr(m, name) for m in metrics], weights=capacities)) for name in _WEIGHTED}
    totals.update({name: sum(getattr(m, name) for m in metrics) for name in _SUMMED})
    reasons: dict[str, int] = {}
    for m in metrics:
        for reason, count in m.rejection_reasons.items():
            reasons[reason] = reasons.get(reason, 0) + count
    output_tokens = sum(r.output_tokens for r in done)
    mean = lambda values: float(np.mean(values)) if values else None  # noqa: E731
    p99 = lambda values: percentile(values, 99) if values else None  # noqa: E731
    sent = [len(replica.requests) for replica in replicas]
    totals.update(
        averaged_over=",".join(sorted({m.averaged_over for m in metrics})),
        kv_cache_usage_peak_perc=max(m.kv_cache_usage_peak_perc for m in metrics),
        completed_requests=len(done),
        mean_batch_size=float(np.mean([m.mean_batch_size for m in metrics])),
        max_batch_size=max(m.max_batch_size for m in metrics),
        throughput_tokens_per_s=output_tokens / makespan if makespan > 0 else 0.0,
        makespan_s=makespan,
        mean_ttft_s=mean(ttfts), p99_ttft_s=p99(ttfts), mean_tpot_s=mean(tpots),
        mean_e2e_s=mean(e2e), p99_e2e_s=p99(e2e),
        mean_normalized_latency_s=mean(normalized), p99_normalized_latency_s=p99(normalized),
        rejection_reasons=dict(sorted(reasons.items())),
        prefix_cache_hit_pct=100.0 * totals["prefix_cache_hits"] / totals["prefix_cache_queries"]
        if totals["prefix_cache_queries"] else 0.0,
        **latency_figures(ttfts, tpots),
        imbalance=max(sent) / float(np.mean(sent)) if sum(sent) else 0.0,
    )
    tiers = [m.tiers for m in metrics if m.tiers]
    if tiers:
        names = list(tiers[0])
        totals["tiers"] = {name: {key: sum(getattr(t[name], key) for t in tiers) for key in _TIER_SUMMED}
                           for name in names}
        for name in names:  # hits of the prompt tokens the fleet looked up
            totals["tiers"][name]["hit_pct"] = 100.0 * totals["tiers"][name]["hit_tokens"] / \
                totals["prefix_cache_queries"] if totals["prefix_cache_queries"] else 0.0
    if transfers is not None:
        moved = [r for r in done if r.landed_s is not None and r.first_token_s is not None]
        shares = [(r.landed_s - r.prefilled_s) / (r.first_token_s - r.arrival_s) for r in moved
                  if r.first_token_s > r.arrival_s]
        totals["mean_transfer_s"] = mean([r.landed_s - r.prefilled_s for r in moved])
        totals["mean_transfer_share_of_ttft"] = mean(shares)
    return rounded(totals)
