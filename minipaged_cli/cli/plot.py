"""PNG plots (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from minipaged_cli.errors import InputError
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def _save(figure: Any, path: Path, plt: Any) -> None:
    try:
        figure.savefig(path, dpi=120)
    except OSError as error:
        raise InputError(f"cannot write: {error.strerror}", field="--plot", value=str(path), has_value=True) from None
    finally:
        plt.close(figure)
