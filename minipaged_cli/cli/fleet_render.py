"""The fleet's tables: one row per replica, then the fleet; with sessions or clients other than open loop, what
the clients saw (``simulate``'s sessions table, one row for the fleet)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from minipaged_cli.cli.render import sessions_table
from minipaged_cli.fleet.fleet import FleetResult


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.1f}"


def fleet_table(result: FleetResult) -> Table:
    document = result.to_dict()
    router = document["router"]
    title = f"Fleet of {document['num_replicas']} replicas, router {router['name']}" + (
        f" ({router['prefix_index']})" if "prefix_index" in router else "")
    if "kv_link" in document:
        link = document["kv_link"]
        title += (f"; KV link {link['bandwidth_bytes_per_s'] / 1e9:g} GB/s + {1e6 * link['latency_s']:g} us, "
                  f"busy {link['busy_pct']:.1f} %, transfer {100 * (document['mean_transfer_share_of_ttft'] or 0):.1f} "
                  "% of TTFT")
    if document["shared_kv_store"]:
        title += "; one shared KV store"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("replica", "role", "requests", "hit %", "KV usage %", "TTFT p50 ms", "TTFT p99 ms",
                   "TPOT p50 ms", "TPOT p99 ms", "tokens/s", "preempted"):
        table.add_column(column, justify="left" if column in ("replica", "role") else "right")

    def row(name: str, role: str, figures: dict[str, Any]) -> list[str]:
        return [name, role, str(figures.get("num_requests", figures["completed_requests"])),
                f"{figures['prefix_cache_hit_pct']:.1f}", f"{figures['kv_cache_usage_perc']:.1f}",
                _ms(figures["p50_ttft_s"]), _ms(figures["p99_ttft_s"]), _ms(figures["p50_tpot_s"]),
                _ms(figures["p99_tpot_s"]), f"{figures['throughput_tokens_per_s']:.0f}",
                str(figures["num_preemptions"])]

    for replica in document["replicas"]:
        table.add_row(*row(str(replica["replica"]), replica["role"], replica))
    table.add_section()
    table.add_row(*row(f"fleet (imbalance {document['imbalance']:.2f})", "", document))
    return table


def fleet_tables(result: FleetResult) -> list[Table]:
    tables = [fleet_table(result)]
    if result.figures.sessions is not None:
        tables.append(sessions_table({"fleet": result.figures.sessions}, ""))
    return tables
