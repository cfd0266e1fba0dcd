"""The data-plane commands' tables: ``run``'s measurements, ``verify``'s checks, ``profile``'s block sizes."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from minipaged_cli.cli.render import memory_table, pct
from minipaged_cli.units import format_bytes


def run_table(report: Any) -> Table:
    """``minipaged run``'s measurements (an ``apps.run.RunReport``), one per row, with their JSON keys."""
    table = Table(title=f"Data plane on {report.device} ({report.backend} backend)", title_justify="left",
                  box=box.SIMPLE_HEAD)
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("JSON key", style="dim")
    rows = [
        ("steps", f"{report.steps:,}", "steps"),
        ("prompt tokens written", f"{report.prompt_tokens:,}", "prompt_tokens"),
        ("decode tokens", f"{report.decode_tokens:,}", "decode_tokens"),
        ("wall time", f"{report.wall_s:.2f} s", "wall_s"),
        ("decode throughput", f"{report.decode_tokens_per_s:,.1f} tok/s", "decode_tokens_per_s"),
        ("decode attention", f"{report.attention_s:.3f} s", "attention_s"),
        ("  K/V read", f"{report.attention_gbps:.2f} GB/s", "attention_gbps"),
        ("cache write", f"{report.cache_write_s:.3f} s", "cache_write_s"),
        ("  K/V written", f"{report.cache_write_gbps:.2f} GB/s", "cache_write_gbps"),
        (f"token states ({report.averaged_over} steps)", f"{pct(report.token_state_pct)} %", "token_state_pct"),
        (f"blocks in use ({report.averaged_over} steps)", f"{pct(report.kv_cache_usage_perc)} %",
         "kv_cache_usage_perc"),
        ("KV pool", format_bytes(report.kv_pool_bytes), "kv_pool_bytes"),
        ("peak memory", format_bytes(report.peak_memory_bytes), "peak_memory_bytes"),
        ("preemptions", f"{report.num_preemptions:,}", "num_preemptions"),
        ("copy-on-write block copies", f"{report.block_copies:,} in {report.copy_s:.3f} s", "block_copies, copy_s"),
    ]
    if report.offload is not None:  # the host tier's copies (apps/offload_steps.py)
        moved = report.offload
        rows += [(f"KV stored to host ({moved.host_blocks:,} blocks)",
                  f"{format_bytes(moved.stored_bytes)}, {moved.store_gbps:.2f} GB/s",
                  "offload.stored_bytes, store_gbps"),
                 ("KV loaded from host", f"{format_bytes(moved.loaded_bytes)}, {moved.load_gbps:.2f} GB/s",
                  "offload.loaded_bytes, load_gbps")]
    for row in rows:
        table.add_row(*row)
    return table


def verify_table(report: Any) -> Table:
    """A row per check of ``minipaged verify`` (a ``verify.VerifyReport``)."""
    verdict = "[green]all passed[/]" if report.passed else "[bold red]FAILED[/]"
    table = Table(title=f"Paged attention vs Hugging Face: {verdict}", title_justify="left", box=box.SIMPLE_HEAD)
    for name, justify in (("check", "left"), ("max abs err", "right"), ("mean abs err", "right"),
                          ("tolerance", "right"), ("result", "left"), ("tolerance because", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for check in report.checks:
        result = "[green]PASS[/]" if check.passed else "[bold red]FAIL[/]"
        table.add_row(check.name, f"{check.max_abs_err:.3g}", f"{check.mean_abs_err:.3g}", f"{check.tolerance:.3g}",
                      result, check.why)
    return table


def profile_table(rows: list[Any]) -> Table:
    """A row per block size (``apps.profile.ProfileRow``); the best value of each column in bold green."""
    table = Table(title="Block sizes on this trace and this KV memory (tail %: unfilled slots of the sequences' last "
                        "blocks, % of allocated slots; tail tok: the same per sequence, time-weighted, about (B-1)/2; "
                        "tables: int32 block-table bytes at the peak; attn: the "
                        "busiest batch)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    # (header, value, better: -1 lower, +1 higher, 0 no ranking, format)
    columns: list[tuple[str, Any, int, str]] = [
        ("block", lambda r: r.block_size, 0, "{:d}"),
        ("tail %", lambda r: r.tail_waste_pct, -1, "{:.2f}"),
        ("tail tok", lambda r: r.mean_tail_waste_tokens, -1, "{:.1f}"),
        ("tables KiB", lambda r: r.block_table_bytes / 1024, -1, "{:,.1f}"),
        ("allocs", lambda r: r.num_block_allocations, -1, "{:,d}"),
        ("tok st %", lambda r: r.metrics.token_state_pct, 1, "{:.1f}"),
        ("batch", lambda r: r.metrics.mean_batch_size, 1, "{:.1f}"),
        ("preempt", lambda r: r.metrics.num_preemptions, -1, "{:,d}"),
        ("tok/s", lambda r: r.metrics.throughput_tokens_per_s, 1, "{:,.0f}"),
        ("prefix lost", lambda r: r.prefix_tokens_lost, -1, "{:,d}"),
        ("write µs/tok", lambda r: r.kernel.cache_write_us_per_token if r.kernel else None, -1, "{:.3f}"),
        ("attn ms", lambda r: r.kernel.attention_us / 1e3 if r.kernel else None, -1, "{:,.2f}"),
        ("attn GB/s", lambda r: r.kernel.attention_gbps if r.kernel else None, 1, "{:.2f}"),
    ]
    for header, *_ in columns:
        table.add_column(header, justify="right")
    best = {}
    for header, value, better, _ in columns:
        values = [value(r) for r in rows if value(r) is not None]
        if better and len(rows) > 1 and values and len(set(values)) > 1:
            best[header] = max(values) if better > 0 else min(values)
    for row in rows:
        cells = []
        for header, value, _, form in columns:
            v = value(row)
            text = "-" if v is None else form.format(v)
            cells.append(f"[bold green]{text}[/]" if header in best and v == best[header] else text)
        table.add_row(*cells)
    return table


def profile_detail(row: Any) -> list[Any]:
    """For one block size: the tail waste of completed requests and where the memory went."""
    from minipaged_cli.apps.profile import tail_waste_histogram

    waste = Table(title=f"Tail waste at completion, block size {row.block_size} (requests per range of tokens)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    histogram = tail_waste_histogram(row.final_tail_waste, row.block_size)
    for label, _ in histogram:
        waste.add_column(label, justify="right")
    waste.add_row(*(f"{count:,}" for _, count in histogram))
    title = f"Where the KV memory goes: % of capacity, time-weighted over {row.metrics.averaged_over} steps"
    return [waste, memory_table({f"block size {row.block_size}": row.metrics}, title)]
