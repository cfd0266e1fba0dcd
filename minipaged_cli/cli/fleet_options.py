"""``simulate``'s fleet options: replicas behind a router, P/D disaggregation over a KV link, a shared KV store,
or a whole ``--fleet FLEET.yaml`` (``fleet/``). Without any of them ``simulate`` replays one engine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from minipaged_cli.cli.render import write_json
from minipaged_cli.errors import InputError
from minipaged_cli.fleet import names
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import SimulationResult
from minipaged_cli.workloads.trace import Trace

if TYPE_CHECKING:
    from minipaged_cli.fleet.config import FleetConfig

PANEL = "Fleet"
ReplicasOpt = Annotated[int | None, typer.Option(
    "--replicas", min=1, rich_help_panel=PANEL, show_default=False,
    help="Replay over this many identical replicas behind --router (one engine each).")]
RouterOpt = Annotated[str, typer.Option(
    "--router", rich_help_panel=PANEL,
    help="Which replica takes a request: " + ", ".join(names.ROUTERS) + " (session-affinity: the replica that "
         "answered the session's last turn, as llm-d's session-affinity scorer; ties: the least loaded, then the "
         "lowest index; llm-d and Dynamo break them at random).")]
PrefixIndexOpt = Annotated[str, typer.Option(
    "--prefix-index", rich_help_panel=PANEL,
    help="What prefix-aware and weighted routers read: " + " or ".join(names.PREFIX_INDEXES) + " (precise: the "
         "replicas' published KV events; approximate: the router's own LRU index of what it sent where).")]
IndexCapacityOpt = Annotated[int, typer.Option(
    "--prefix-index-capacity", min=1, rich_help_panel=PANEL, help="Blocks the approximate index remembers.")]
WeightsOpt = Annotated[str, typer.Option(
    "--router-weights", rich_help_panel=PANEL,
    help="The weighted router's scorers, name:weight comma-separated: " + ", ".join(names.WEIGHT_NAMES) + " (session: "
         "1 for the replica that answered the session's last turn; add it as session:5 beside the others).")]
PrefillReplicasOpt = Annotated[int | None, typer.Option(
    "--prefill-replicas", min=1, rich_help_panel=PANEL, show_default=False,
    help="P/D disaggregation: this many prefill replicas (with --decode-replicas).")]
DecodeReplicasOpt = Annotated[int | None, typer.Option(
    "--decode-replicas", min=1, rich_help_panel=PANEL, show_default=False, help="P/D: this many decode replicas.")]
LinkBandwidthOpt = Annotated[str, typer.Option(
    "--kv-link-bandwidth", rich_help_panel=PANEL, help="P/D: the KV link's bandwidth (50GB/s).")]
LinkLatencyOpt = Annotated[str, typer.Option(
    "--kv-link-latency", rich_help_panel=PANEL, help="P/D: each transfer's latency (20us).")]
PrefillThresholdOpt = Annotated[int, typer.Option(
    "--prefill-threshold", min=0, rich_help_panel=PANEL,
    help="P/D: prompts of at most this many tokens prefill on their decode replica.")]
SharedStoreOpt = Annotated[bool, typer.Option(
    "--shared-kv-store/--no-shared-kv-store", rich_help_panel=PANEL,
    help="The --cpu-kv-memory / --disk-kv-memory tiers become one store of that size shared by every replica "
         "(instead of one each).")]
LogDecisionsOpt = Annotated[bool, typer.Option(
    "--log-decisions/--no-log-decisions", rich_help_panel=PANEL,
    help="Every routing decision (time, request, replica, each candidate's score) in the --json document's "
         "fleet.decisions.")]
FleetFileOpt = Annotated[Path | None, typer.Option(
    "--fleet", rich_help_panel=PANEL, metavar="FLEET.yaml", show_default=False,
    help="A fleet file (configs/fleets/): pools with their own model, GPU and KV memory, router, link, store.")]


def fleet_config(config: SimConfig, *, replicas: int | None, router: str, prefix_index: str, index_capacity: int,
                 weights: str, prefill_replicas: int | None, decode_replicas: int | None, link_bandwidth: str,
                 link_latency: str, prefill_threshold: int, shared_kv_store: bool, fleet_file: Path | None,
                 log_decisions: bool, record_timeline: bool) -> FleetConfig | None:
    """The fleet the options ask for, or None (one engine: ``simulate`` as ever, which never imports the fleet's
    configuration)."""
    options = {"log_decisions": log_decisions, "record_timeline": record_timeline}
    if fleet_file is not None:
        from minipaged_cli.fleet.fleet_file import load_fleet_file

        return load_fleet_file(fleet_file, config, **options)
    if replicas is None and prefill_replicas is None and decode_replicas is None and not shared_kv_store:
        return None
    from minipaged_cli.fleet import config as fleets

    router_config = fleets.RouterConfig(router, prefix_index, index_capacity, fleets.parse_weights(weights))
    if (prefill_replicas is None) != (decode_replicas is None):
        raise InputError("P/D disaggregation takes both --prefill-replicas and --decode-replicas",
                         field="--prefill-replicas" if prefill_replicas is None else "--decode-replicas")
    if prefill_replicas is not None:
        if replicas is not None:
            raise InputError("give --replicas or --prefill-replicas/--decode-replicas, not both", field="--replicas",
                             value=replicas, has_value=True)
        link = fleets.KvLink(fleets.parse_bandwidth(link_bandwidth), fleets.parse_duration(link_latency))
        pools = (fleets.ReplicaPool("prefill", prefill_replicas, config, "prefill", "--prefill-replicas"),
                 fleets.ReplicaPool("decode", decode_replicas, config, "decode", "--decode-replicas"))
        return fleets.FleetConfig(pools, router_config, link, prefill_threshold, shared_kv_store, **options)
    pool = fleets.ReplicaPool("replicas", replicas or 1, config, source="--replicas")
    return fleets.FleetConfig((pool,), router_config, shared_kv_store=shared_kv_store, **options)


def run_fleet_command(trace: Trace, config: SimConfig, fleet: FleetConfig, console: Console, stdout: Console,
                      json_path: str | None, plot: Path | None) -> None:
    """Replay, print the table, write the JSON (``fleet`` beside simulate's ``trace`` and ``config``) and plot;
    exit 1 on an invariant violation (``--check-invariants``: a bug in the allocator)."""
    from minipaged_cli.cli.fleet_render import fleet_tables
    from minipaged_cli.fleet.fleet import run_fleet  # the fleet engine: a one-engine simulate never loads it

    result = run_fleet(trace, fleet)
    for table in fleet_tables(result):
        console.print(table)
    if json_path is not None:
        document: dict[str, Any] = SimulationResult(trace, config, {}).to_dict()
        del document["strategies"]
        document["fleet"] = result.to_dict()
        write_json(document, json_path, stdout)
    if plot is not None:
        from minipaged_cli.cli.fleet_plot import plot_fleet_timeline

        plot_fleet_timeline(result, plot)
        console.print(f"plot: {plot}", markup=False)
    if result.figures.totals["invariant_violations"]:
        raise typer.Exit(1)
