"""``sweep``'s own options: its axes over the host tiers and fleets (each a comma-separated list whose every value
crosses every other axis; the engine options every command takes are in ``common.py`` and ``tier_options.py``), and
how it searches and where it runs."""

from __future__ import annotations

from typing import Annotated

import typer

from minipaged_cli.apps.sweep import SLO_METRICS
from minipaged_cli.cli.tier_options import OFFLOAD_POLICIES, TIER_EVICTIONS, TIER_INCLUSIONS
from minipaged_cli.fleet.config import ROUTERS

CpuKvMemoryAxis = Annotated[str | None, typer.Option(
    "--cpu-kv-memory", show_default=False, help="Host tiers under the prefix cache, e.g. 0,64GiB,1TiB (as in "
    "simulate); --plot: hits and TTFT against them. The 0 point runs once for all the tiers' policies.")]
OffloadPolicyAxis = Annotated[str, typer.Option(
    "--offload-policy", help="As in simulate, comma-separated: " + ",".join(OFFLOAD_POLICIES) + ".")]
TierEvictionAxis = Annotated[str, typer.Option(
    "--tier-eviction", help="As in simulate, comma-separated: " + ",".join(TIER_EVICTIONS) + ".")]
TierInclusionAxis = Annotated[str, typer.Option(
    "--tier-inclusion", help="As in simulate, comma-separated: " + ",".join(TIER_INCLUSIONS) + " (exclusive "
    "needs --offload-policy on-eviction: crossed with write-through it is left out).")]
ReplicasAxis = Annotated[str, typer.Option(
    "--replicas", help="Fleet sizes, comma-separated: N > 1 replays paged over N replicas behind each of --routers.")]
MaxConcurrencyAxis = Annotated[str | None, typer.Option(
    "--max-concurrency", show_default=False,
    help="Open loop at each rate with at most this many requests in flight (vllm bench serve's), comma-separated "
         "(8,32): an axis of the sweep; the time requests waited in the client is not in their TTFT.")]
RoutersAxis = Annotated[str, typer.Option(
    "--routers", help="Fleet routers, comma-separated: " + ", ".join(ROUTERS) + ".")]

SloOpt = Annotated[list[str] | None, typer.Option(
    "--slo", help="NAME=SECONDS, repeatable; NAME: " + ", ".join(SLO_METRICS) + " (mean unless -p99). Searches each "
    "curve's sustainable rate: the highest meeting every SLO, with every tested rate below it meeting them too, to 3 "
    "significant digits.", show_default=False)]
SearchStepsOpt = Annotated[int, typer.Option(
    "--search-steps", help="Most bisection rounds after the grid; the search ends sooner once no 3-digit rate is "
    "left inside a bracket.")]
SeedsOpt = Annotated[int, typer.Option(
    "--seeds", help="Arrival seeds per point (--seed, --seed + 1, ...): each metric is the MEAN over the seeds' "
    "replays, so one seed's noise is not taken for capacity.")]
WorkersOpt = Annotated[int | None, typer.Option(
    "--workers", help="Local worker processes. Default: every core.", show_default=False)]
RayOpt = Annotated[str | None, typer.Option(
    "--ray", help="Run the replays as Ray tasks: HOST:PORT of a cluster, or no value (auto: RAY_ADDRESS or a cluster "
    "started on the local host, else a local cluster started for this sweep). Needs pip install -e \".[ray]\".",
    metavar="[ADDRESS]", show_default=False)]
