"""PNG plots (matplotlib, the [plot] extra, imported only when a plot is asked for)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from minipaged_cli.cli.outputs import atomic_output
from minipaged_cli.sim.categories import CATEGORIES
from minipaged_cli.sim.replay import SimulationResult

_LABELS = {
    "token_state": "token states",
    "reserved_future": "reserved (future tokens)",
    "internal_frag": "internal fragmentation",
    "external_frag": "external fragmentation",
    "free": "free",
}
_COLOURS = {
    "token_state": "#2f7d32",
    "reserved_future": "#f9a825",
    "internal_frag": "#e65100",
    "external_frag": "#b71c1c",
    "free": "#cfd8dc",
}
_MAX_POINTS = 2000


def plot_memory_timeline(result: SimulationResult, path: Path) -> None:
    """One stacked-area panel per strategy: the memory categories (% of capacity) over simulated time."""
    plt = _pyplot()
    strategies = result.strategies
    figure, axes = plt.subplots(len(strategies), 1, figsize=(10, 2.2 * len(strategies) + 0.8), sharex=True,
                                squeeze=False)
    for axis, (name, metrics) in zip(axes[:, 0], strategies.items(), strict=True):
        timeline = metrics.timeline
        times = np.asarray(timeline.get("time_s", []))
        stride = max(1, len(times) // _MAX_POINTS)
        series = [np.asarray(timeline[c])[::stride] for c in CATEGORIES] if len(times) else []
        if len(times):
            axis.stackplot(times[::stride], *series, labels=[_LABELS[c] for c in CATEGORIES],
                           colors=[_COLOURS[c] for c in CATEGORIES], step="post", linewidth=0)
        axis.set_ylim(0, 100)
        axis.set_ylabel("% of KV")
        axis.set_title(f"{name}: token states {metrics.token_state_pct:.1f}% ({metrics.averaged_over} steps)",
                       fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("simulated time (s)")
    axes[0, 0].legend(loc="upper center", bbox_to_anchor=(0.5, 1.6), ncol=5, fontsize=8, frameon=False)
    figure.suptitle(f"{result.trace.name}: KV memory over time ({result.config.model.name}, "
                    f"{result.config.kv_capacity_tokens:,} token slots)", y=0.995)
    figure.tight_layout()
    _save(figure, path, plt)


def plot_run_steps(report: Any, path: Path, *, title: str) -> None:
    """``minipaged run``: time of attention and cache writes per step, with the batch and the live tokens."""
    plt = _pyplot()
    steps = np.arange(1, report.steps + 1)
    figure, (times, load) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    times.plot(steps, report.per_step["attention_ms"], label="decode attention", linewidth=0.8)
    times.plot(steps, report.per_step["cache_write_ms"], label="cache write", linewidth=0.8)
    times.set_ylabel("ms per step (all layers)")
    times.legend(frameon=False)
    load.plot(steps, report.per_step["live_tokens"], color="#2f7d32", linewidth=0.8)
    load.set_ylabel("live tokens")
    batch = load.twinx()
    batch.plot(steps, report.per_step["batch_size"], color="#e65100", linewidth=0.8)
    batch.set_ylabel("decoding sequences", color="#e65100")
    load.set_xlabel("step")
    figure.suptitle(title)
    figure.tight_layout()
    _save(figure, path, plt)


def plot_block_sizes(rows: list[Any], path: Path, *, title: str) -> None:
    """``minipaged profile``: waste and attention time against block size (log2 axis)."""
    plt = _pyplot()
    sizes = [r.block_size for r in rows]
    figure, waste = plt.subplots(figsize=(8, 4.5))
    waste.plot(sizes, [r.mean_tail_waste_tokens for r in rows], "o-", color="#e65100", label="tail waste (tokens)")
    waste.plot(sizes, [r.expected_tail_waste_tokens for r in rows], ":", color="#e65100", label="(B-1)/2")
    waste.set_xscale("log", base=2)
    waste.set_xticks(sizes, [str(s) for s in sizes])
    waste.set_xlabel("block size (tokens)")
    waste.set_ylabel("tail waste per sequence (tokens)", color="#e65100")
    handles, labels = waste.get_legend_handles_labels()
    timed = [r for r in rows if r.kernel is not None]
    if timed:
        attention = waste.twinx()
        attention.plot([r.block_size for r in timed], [r.kernel.attention_us for r in timed], "s-", color="#1565c0",
                       label="decode attention (µs)")
        attention.set_ylabel("decode attention, busiest batch (µs)", color="#1565c0")
        more_handles, more_labels = attention.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    waste.legend(handles, labels, frameon=False, loc="upper center")
    figure.suptitle(title)
    figure.tight_layout()
    _save(figure, path, plt)


def plot_memory_layout(result: Any, path: Path) -> None:
    """``simulate --plot-layout``: the KV memory as an image, time across, slot address down, a colour per
    sequence and free space blank; one panel per strategy (``sim/layout.py`` samples it)."""
    plt = _pyplot()
    names = list(result.strategies)
    figure, axes = plt.subplots(len(names), 1, figsize=(11, 2.3 * len(names) + 0.6), squeeze=False, sharex=True)
    palette = plt.get_cmap("tab20").colors
    for ax, name in zip(axes[:, 0], names, strict=True):
        layout = result.strategies[name].layout
        owners = layout.owners
        image = np.ones((*owners.shape, 3))  # white: free
        held = owners >= 0
        colours = np.asarray(palette)[(owners[held] * 7919) % len(palette)]  # neighbours' ids, apart in colour
        image[held] = colours
        end = layout.times_s[-1] if len(layout.times_s) else 1.0
        ax.imshow(image, aspect="auto", interpolation="nearest",
                  extent=(layout.times_s[0] if len(layout.times_s) else 0.0, end, layout.capacity_tokens, 0))
        ax.set_ylabel("slot (token)")
        ax.set_title(f"{name}: {100 * held.mean():.0f} % of the sampled slots held", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("simulated time (s)")
    figure.suptitle(f"{result.trace.name}: physical KV memory, a colour per sequence, free space white", fontsize=10)
    figure.tight_layout()
    _save(figure, path, plt, "--plot-layout")


def plot_sweep(result: Any, path: Path, *, title: str) -> None:
    """``minipaged sweep``: normalized latency against request rate, a curve per strategy, a panel per value of
    the other axes (the vLLM paper's Fig. 12), with each curve's sustainable rate marked when searched."""
    plt = _pyplot()
    panels = sorted({p.panel for p in result.rows}, key=lambda p: p.sort_key())
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(max(7, 5 * columns), 4 * rows), squeeze=False)
    capacities = {c.curve: c for c in result.capacities or []}
    limit = next((s.limit_s for s in result.slos if s.name == "normalized-latency"), None)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for strategy in result.axes.curve_strategies:
            points = sorted((p for p in result.rows if p.panel == panel and p.strategy == strategy),
                            key=lambda p: p.rate)
            shown = [(p.rate, result.rows[p]["normalized_latency_mean_s"]) for p in points
                     if result.rows[p]["normalized_latency_mean_s"] is not None]
            if not shown:
                continue
            line, = ax.plot(*zip(*shown, strict=True), "o-", markersize=3, label=strategy)
            capacity = capacities.get(points[0].curve)
            if capacity is not None and capacity.status == "found":
                ax.axvline(capacity.rate, color=line.get_color(), linestyle=":", linewidth=0.8)
        if limit is not None:
            ax.axhline(limit, color="grey", linestyle="--", linewidth=0.8, label="SLO")
        ax.set_yscale("log")
        _plain_log_labels(ax.yaxis)
        ax.set_xlabel("request rate (requests/s)")
        ax.set_ylabel("normalized latency (s/token)")
        name = ", ".join(f"{k}={'default' if v is None else v}" for k, v in vars(panel).items()
                         if k in result.axes.varying())
        ax.set_title(f"{panel.model} on {panel.gpu}" + (f", {name}" if name else ""), fontsize=9)
        ax.legend(frameon=False, fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    _save(figure, path, plt)


def plot_concurrency(result: Any, path: Path, *, title: str) -> None:
    """``minipaged sweep --concurrency``: mean TTFT and TPOT against output throughput, a point per number of
    closed-loop clients (labelled), a curve per strategy and value of the other axes: the curve ``vllm bench`` users
    draw."""
    plt = _pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    curves: dict[Any, list[Any]] = {}
    for point in result.rows:  # (closed loops ignore the rate: one curve per everything else)
        curves.setdefault(replace(point, rate=0.0, concurrency=0), []).append(point)
    for curve, points in sorted(curves.items(), key=lambda item: item[0].sort_key()):
        points = sorted({p.concurrency: p for p in points}.values(), key=lambda p: p.concurrency)
        label = ", ".join([curve.strategy] + [f"{k}={v}" for k, v in vars(curve).items()
                                              if k in result.axes.varying() and k != "concurrency"])
        for ax, metric, scale in ((axes[0], "ttft_mean_s", 1.0), (axes[1], "tpot_mean_s", 1e3)):
            shown = [(result.rows[p]["throughput_tokens_per_s"], scale * result.rows[p][metric], p.concurrency)
                     for p in points if result.rows[p][metric] is not None]
            if not shown:
                continue
            x, y, _ = zip(*shown, strict=True)
            ax.plot(x, y, "o-", markersize=3, label=label)
            for xi, yi, n in shown:
                ax.annotate(str(n), (xi, yi), textcoords="offset points", xytext=(3, 3), fontsize=7)
    for ax, ylabel in zip(axes, ("mean TTFT (s)", "mean TPOT (ms)"), strict=True):
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(ylabel)
        ax.legend(frameon=False, fontsize=8)
    figure.suptitle(f"{title} (points: clients)", fontsize=10)
    figure.tight_layout()
    _save(figure, path, plt)


def plot_host_tier(result: Any, path: Path, *, title: str, reference: dict[str, float] | None = None) -> None:
    """``minipaged sweep --cpu-kv-memory``: the prompt tokens found in the prefix cache (solid: GPU + host; dotted:
    the GPU's part) and the mean TTFT against the host tier's size, a curve per policy and value of the other
    axes (Mooncake's Fig. 9). ``reference``: a hit rate (%) per host size, drawn dashed (e.g. a plain LRU of the
    same total capacity)."""
    plt = _pyplot()
    host_bytes = {p.cpu_kv_memory: p.host_bytes for p in result.rows}
    sizes = sorted(host_bytes, key=host_bytes.__getitem__)
    x = {size: index for index, size in enumerate(sizes)}
    figure, (hits, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    varying = [name for name in result.axes.varying() if name != "cpu_kv_memory"]
    curves: dict[Any, list[Any]] = {}
    for point in result.rows:
        curves.setdefault(replace(point, cpu_kv_memory=None), []).append(point)
    for curve, points in sorted(curves.items(), key=lambda item: item[0].sort_key()):
        points.sort(key=lambda p: x[p.cpu_kv_memory])
        rows = [result.rows[p] for p in points]
        positions = [x[p.cpu_kv_memory] for p in points]
        label = " ".join([f"{curve.offload_policy}, {curve.tier_eviction}"]
                         + [f"{name}={getattr(curve, name)}" for name in varying
                            if name not in ("offload_policy", "tier_eviction")]
                         + ([f"{curve.strategy}"] if len(result.axes.strategies) > 1 else [])
                         + ([f"{curve.rate:g}/s"] if len(result.axes.rates) > 1 else []))
        line, = hits.plot(positions, [r["prefix_cache_hit_pct"] + r["tier_hit_pct"] for r in rows], "o-",
                          markersize=4, label=label)
        hits.plot(positions, [r["prefix_cache_hit_pct"] for r in rows], ":", color=line.get_color(), linewidth=1)
        shown = [(position, r["ttft_mean_s"]) for position, r in zip(positions, rows, strict=True)
                 if r["ttft_mean_s"] is not None]
        if shown:
            ttft.plot(*zip(*shown, strict=True), "o-", markersize=4, color=line.get_color(), label=label)
    if reference:
        known = [size for size in sizes if size in reference]
        hits.plot([x[size] for size in known], [reference[size] for size in known], "k--", linewidth=1,
                  label="plain LRU, same total tokens")
    for ax in (hits, ttft):
        ax.set_xticks(range(len(sizes)), [size or "0" for size in sizes])
        ax.set_xlabel("host memory tier (--cpu-kv-memory)")
        ax.grid(True, linestyle=":", linewidth=0.5)
    hits.set_ylim(bottom=0)
    hits.set_ylabel("prompt tokens found cached (%)")
    hits.set_title("hits: GPU + host (solid), GPU alone (dotted)", fontsize=9)
    hits.legend(frameon=False, fontsize=7)
    ttft.set_ylim(bottom=0)
    ttft.set_ylabel("mean TTFT (simulated s)")
    ttft.set_title("time to first token", fontsize=9)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    _save(figure, path, plt)


def _pyplot() -> Any:
    """matplotlib.pyplot, drawing to files only; text drawn as written: a '$' in a trace's name is not the start
    of a formula (mathtext would fail on the whole plot, after the whole replay)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def _plain_log_labels(axis: Any) -> None:
    """A log axis labelled 0.01, 0.1, 1, 10 (and 0.02, 0.05, ... on a short one): matplotlib's own labels are
    mathtext formulas, which ``_pyplot`` keeps from being parsed, so they would print as raw TeX."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return f"{x:g}"

    axis.set_major_formatter(Plain())
    axis.set_minor_formatter(Plain(labelOnlyBase=False))


def _save(figure: Any, path: Path, plt: Any, field: str = "--plot") -> None:
    try:
        with atomic_output(path, field) as temporary:
            # The format from the path asked for (the temporary's name is not it), PNG when it has no suffix.
            figure.savefig(temporary, dpi=120, format=Path(path).suffix.removeprefix(".").lower() or "png")
    finally:
        plt.close(figure)
