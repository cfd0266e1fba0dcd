"""The one place that formats results: Rich tables, JSON documents, progress bars. The library only returns data.

``simulate``'s tables (with its tiers and KV cache groups) are here; the data-plane commands' (``run``, ``verify``,
``profile``) in ``render_dataplane.py``.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from minipaged_cli.cli.flags import note_line
from minipaged_cli.cli.outputs import STDOUT, write_text
from minipaged_cli.memory.kv_groups import block_bytes as kv_block_bytes
from minipaged_cli.sim.accounting import StrategyMetrics
from minipaged_cli.sim.categories import CATEGORIES, LABELS
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import SimulationResult
from minipaged_cli.units import format_bytes
from minipaged_cli.workloads.presets import ModelSpec

if TYPE_CHECKING:
    from rich.progress import Progress

    from minipaged_cli.sim.session_report import SessionMetrics


def write_json(document: dict[str, Any], destination: str, stdout: Console) -> None:
    """``destination`` '-' writes to stdout; anything else is a file path, written atomically."""
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    if destination == STDOUT:
        stdout.file.write(text)
        stdout.file.flush()
    else:
        write_text(destination, text, "--json")


def bold(name: str) -> str:
    """A name of the user's (a trace's, a model's) in bold, escaped: markup in it prints as text."""
    return f"[bold]{escape(name)}[/]"


def step_times(config: SimConfig) -> str:
    """Where the simulated step times come from."""
    if config.calibration is not None:
        return f"calibration {config.calibration.describe(config.model)}"
    return f"{config.gpu.name}'s efficiency model"


def kv_format(model: ModelSpec) -> str:
    """What one token's KV costs: its element type (auto: the model's dtype) and bytes, every layer keeping it."""
    dtype = model.dtype if model.kv_cache_dtype == "auto" else model.kv_cache_dtype
    return f"KV cache {dtype}, {model.kv_bytes_per_token:,} B a token"


def scheduling(config: SimConfig) -> str:
    """The engine and its limits, as the header names them."""
    engine = config.engine
    budget = f"{engine.max_batched_tokens:,} tokens a step" if engine.max_batched_tokens else "whole prompts"
    caching = "prefix caching" if config.cache.prefix_caching else "no prefix caching"
    return f"vLLM {engine.scheduler} scheduling: {engine.max_num_seqs:,} seqs, {budget}, {caching}"


def simulation_tables(result: SimulationResult, capacity_origin: str) -> list[Any]:
    """A header line, the memory table and the service table."""
    config, trace = result.config, result.trace
    # Names and options are the user's text: escaped, so that "x[/y]" prints as itself, not as Rich markup.
    header = (
        f"{bold(trace.name)}: {trace.num_requests} requests, {trace.prompt_tokens:,} prompt + "
        f"{trace.output_tokens:,} output tokens · {escape(config.model.name)} on {escape(config.gpu.name)} · KV "
        f"capacity {config.kv_capacity_tokens:,} tokens = {config.cache.num_blocks:,} blocks x {config.block_size} "
        f"({format_bytes(config.kv_memory_bytes)}, {escape(note_line(capacity_origin))}) · {kv_groups_phrase(config)}"
        f"max model len {config.model_len:,} · step times: {escape(step_times(config))}"
    )
    rows = result.strategies
    overs = {m.averaged_over for m in rows.values()}
    # Saturated steps (a request waiting for memory) show how well a strategy packs a full cache; a strategy
    # that never filled up is averaged over all its busy steps instead.
    mixed = len(overs) > 1
    over = "the steps named in the last column" if mixed else f"{next(iter(overs))} steps"
    memory = memory_table(rows, f"Where the KV memory goes: % of capacity, time-weighted over {over}", mixed)

    service = Table(title="Serving, in simulated time", title_justify="left", box=box.SIMPLE_HEAD)
    service.add_column("strategy", no_wrap=True)
    columns = ["done", "rejected", "preempted", "batch mean/max", "output tok/s", "makespan s", "TTFT mean/p99 s",
               "TPOT ms", "e2e mean/p99 s"]
    if any(m.invariant_violations for m in rows.values()):
        columns.append("invariant violations")
    for name in columns:
        service.add_column(name, justify="right")
    for name, m in rows.items():
        cells = [name, f"{m.completed_requests:,}", f"{m.rejected_requests:,}", f"{m.num_preemptions:,}",
                 f"{m.mean_batch_size:.1f}/{m.max_batch_size}", f"{m.throughput_tokens_per_s:,.0f}",
                 f"{m.makespan_s:,.1f}", f"{_maybe(m.mean_ttft_s, '{:.2f}')}/{_maybe(m.p99_ttft_s, '{:.2f}')}",
                 _maybe(m.mean_tpot_s, "{:.1f}", 1000),
                 f"{_maybe(m.mean_e2e_s, '{:.2f}')}/{_maybe(m.p99_e2e_s, '{:.2f}')}"]
        service.add_row(*cells, *([str(m.invariant_violations)] if len(columns) > 9 else []))
    tables = [header, f"{kv_format(config.model)} · {scheduling(config)}", vllm_startup_line(config), memory,
              service]
    if result.all_full_attention is not None:
        tables.append(_hybrid_table(result))
    sharing = config.cache.prefix_caching or any(r.n > 1 for r in trace.requests)
    if sharing or config.engine.preemption == "swap" or any(m.rejection_reasons for m in rows.values()):
        tables.append(_sharing_table(result))
    if result.without_tiers:
        tables += [_tiers_table(result), _tiers_gain_table(result)]
    if any(m.sessions is not None for m in rows.values()):
        tables.append(sessions_table({name: m.sessions for name, m in rows.items() if m.sessions is not None}))
    return tables


def vllm_startup_line(config: SimConfig) -> str:
    """The pool as vLLM's startup log reports it (``kv_cache_utils.update_kv_cache_capacity``)."""
    return (f"vLLM {config.engine.vllm_version}: GPU KV cache size: {config.kv_size_tokens:,} tokens, Maximum "
            f"concurrency for {config.model_len:,} tokens per request: {config.max_concurrency:.2f}x")


def kv_groups_phrase(config: SimConfig) -> str:
    """The KV cache groups, where a model has sliding windows (empty otherwise)."""
    if not config.model.is_hybrid:
        return ""
    groups = config.kv_cache_groups
    if not config.cache.hybrid_kv:
        return "every layer full attention (--no-hybrid-kv) · "
    sliding = sum(g.is_sliding for g in groups)
    return (f"{len(groups)} KV cache groups of {groups[0].num_layers} layers ({sliding} sliding window "
            f"{config.model.sliding_window:,}): slots are per group, vLLM's KV size {config.kv_size_tokens:,} "
            "tokens · ")


def _hybrid_table(result: SimulationResult) -> Table:
    """The paged strategy with the hybrid manager against every layer as full attention, on the same memory."""
    assert result.all_full_attention is not None
    full_config, full = result.all_full_attention
    table = Table(title="Hybrid KV cache manager vs every layer full attention (paged, same KV memory)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("KV cache", "blocks", "vLLM KV size (tokens)", "token states %", "free %", "done", "preempted",
                 "batch mean", "output tok/s"):
        table.add_column(name, justify="left" if name == "KV cache" else "right")
    for label, config, m in (("hybrid groups", result.config, result.strategies["paged"]),
                             ("all full attention", full_config, full)):
        table.add_row(label, f"{config.cache.num_blocks:,}", f"{config.kv_size_tokens:,}", pct(m.token_state_pct),
                      pct(m.free_pct), f"{m.completed_requests:,}", f"{m.num_preemptions:,}",
                      f"{m.mean_batch_size:.1f}", f"{m.throughput_tokens_per_s:,.0f}")
    return table


def _tiers_table(result: SimulationResult) -> Table:
    """Per strategy and tier below the GPU: hits, what moved over its links, evictions."""
    config, tiers = result.config, result.config.tiers
    title = (f"Prefix-cache tiers below the GPU ({tiers.offload_policy} stores, {tiers.tier_eviction} eviction, "
             f"{'layer-by-layer' if tiers.layerwise_loads else 'whole'} loads"
             f"{', exclusive' if tiers.tier_inclusion == 'exclusive' else ''})") if config.cache.prefix_caching else \
        "The host tier below the GPU"
    if config.engine.preemption == "swap":  # (v0: the link busy % counts the swaps too)
        title += ", also the swap space"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("strategy", "tier", "capacity", "hit tokens", "hit %", "recomputed", "stored", "loaded",
                 "dropped stores", "evictions", "link busy write/read %"):
        table.add_column(name, justify="left" if name in ("strategy", "tier") else "right")
    block_bytes = kv_block_bytes(config.model, config.kv_cache_groups, config.block_size)  # (one group's pages)
    for name, m in result.strategies.items():
        for tier in m.tiers.values():
            table.add_row(name, tier.name, format_bytes(tier.capacity_blocks * block_bytes), f"{tier.hit_tokens:,}",
                          pct(tier.hit_pct), f"{tier.recomputed_tokens:,}", format_bytes(tier.stored_bytes),
                          format_bytes(tier.loaded_bytes), f"{tier.dropped_stores:,}", f"{tier.evictions:,}",
                          f"{pct(tier.write_busy_pct)}/{pct(tier.read_busy_pct)}")
    return table


def _tiers_gain_table(result: SimulationResult) -> Table:
    """What the tiers buy: prefix hits, TTFT and throughput with them and without them."""
    table = Table(title="With and without the tiers", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("strategy", "tiers", "hit % (GPU + tiers)", "TTFT mean/p99 s", "output tok/s", "makespan s"):
        table.add_column(name, justify="left" if name in ("strategy", "tiers") else "right")
    for name, without in result.without_tiers.items():
        for label, m in (("without", without), ("with", result.strategies[name])):
            hit = m.prefix_cache_hit_pct + sum(t.hit_pct for t in m.tiers.values())
            table.add_row(name, label, pct(hit), f"{_maybe(m.mean_ttft_s, '{:.2f}')}/{_maybe(m.p99_ttft_s, '{:.2f}')}",
                          f"{m.throughput_tokens_per_s:,.0f}", f"{m.makespan_s:,.1f}")
    return table


def sessions_table(sessions: dict[str, SessionMetrics], first_column: str = "strategy") -> Table:
    """Sessions and clients (``sim/session_report.py``), a row each (a strategy, or a fleet): sessions done and how
    long they took, turns per second, the prefix hit rate of first turns against later ones (whether the cache
    holds conversations), client waits."""
    first = next(iter(sessions.values()))
    clients = first.clients + (f" ({first.concurrency})" if first.concurrency is not None else "")
    table = Table(title=f"Sessions, {clients} clients", title_justify="left", box=box.SIMPLE_HEAD)
    for name in (first_column, "sessions done", "session s mean/p99", "turns/s", "hit % turn 1", "hit % later turns",
                 "turns rejected/not sent", "client wait s mean/p99"):
        table.add_column(name, justify="left" if name == first_column else "right")
    for name, s in sessions.items():
        table.add_row(name, f"{s.completed_sessions}/{s.num_sessions}",
                      f"{_maybe(s.mean_session_s, '{:.2f}')}/{_maybe(s.p99_session_s, '{:.2f}')}",
                      f"{s.turns_per_s:.2f}", _maybe(s.hit_pct_first_turn, "{:.1f}"),
                      _maybe(s.hit_pct_later_turns, "{:.1f}"), f"{s.turns_rejected}/{s.turns_not_sent}",
                      f"{s.mean_client_wait_s:.3f}/{s.p99_client_wait_s:.3f}")
    return table


def _sharing_table(result: SimulationResult) -> Table:
    """Prefix cache, copy-on-write, swapping and why requests were rejected, per strategy."""
    table = Table(title="Sharing, preemption and rejections", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("strategy", no_wrap=True)
    for name in ("prefix hits / queries (tokens)", "hit %", "evictions", "copy-on-write", "swaps",
                 "swapped out / in", "rejected because"):
        table.add_column(name, justify="left" if name == "rejected because" else "right")
    for name, m in result.strategies.items():
        reasons = "; ".join(f"{count:,} {reason}" for reason, count in m.rejection_reasons.items()) or "-"
        table.add_row(name, f"{m.prefix_cache_hits:,} / {m.prefix_cache_queries:,}", pct(m.prefix_cache_hit_pct),
                      f"{m.num_evictions:,}", f"{m.num_copy_on_writes:,}", f"{m.num_swaps:,}",
                      f"{format_bytes(m.swap_out_bytes)} / {format_bytes(m.swap_in_bytes)}", reasons)
    return table


def memory_table(rows: dict[str, StrategyMetrics], title: str, show_over: bool = False) -> Table:
    """The memory categories (``sim.categories``) of each row, % of capacity, with usage; ``show_over``: a
    column saying which steps each row averages over."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("strategy", no_wrap=True)
    for category in CATEGORIES:
        table.add_column(LABELS[category], justify="right")
    table.add_column("usage", justify="right")
    if show_over:
        table.add_column("over")
    for name, m in rows.items():
        cells = [pct(m.token_state_pct), pct(m.reserved_future_pct), pct(m.internal_frag_pct),
                 pct(m.external_frag_pct), pct(m.free_pct), pct(m.kv_cache_usage_perc)]
        table.add_row(name, *cells, *([m.averaged_over] if show_over else []))
    return table


def pct(value: float) -> str:
    """A percentage as every table writes it."""
    return f"{value:.1f}"


def _maybe(value: float | None, form: str, scale: float = 1.0) -> str:
    """A measurement that may not exist (no request completed): an en dash then."""
    return "–" if value is None else form.format(scale * value)  # noqa: RUF001 - an en dash, as tables write it


class ReplayProgress:
    """A progress bar of the requests replayed, that appears only when a replay has run for more than
    ``delay_s`` seconds, on a terminal (piped, a transient bar would only leave an empty line).

    Called as ``progress(strategy, requests_done)`` from the replay's loop, as often as every event; it redraws
    at most ten times a second.
    """

    def __init__(self, console: Console, total_per_strategy: int, strategies: tuple[str, ...],
                 delay_s: float = 1.0) -> None:
        self.console = console
        self.total = total_per_strategy * len(strategies)
        self.offsets = {name: i * total_per_strategy for i, name in enumerate(strategies)}
        self.show_at = time.monotonic() + delay_s
        self.next_update = self.show_at
        self.bar: Progress | None = None
        self.task: Any = None

    def __call__(self, strategy: str, done: int) -> None:
        now = time.monotonic()
        if now < self.next_update:
            return
        if not self.console.is_terminal:  # (asked once: Rich's answer looks at the stream, and this runs per event)
            self.next_update = float("inf")
            return
        self.next_update = now + 0.1
        if self.bar is None:  # (Rich's progress module is imported by the replays that show a bar alone)
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("replaying {task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("requests"), TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(strategy, total=self.total)
        self.bar.update(self.task, completed=self.offsets[strategy] + done, description=strategy)

    def for_replay(self) -> ReplayProgress | None:
        """What a replay calls at every event: this progress on a terminal, else None (piped, no bar ever shows:
        the replay calls nothing, where each of its events was a call)."""
        if self.console.is_terminal:
            return self
        self.next_update = float("inf")  # (the answer the first call would give, kept: the stream is asked once)
        return None

    def __enter__(self) -> ReplayProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

