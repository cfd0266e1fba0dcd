"""``minipaged sweep``: many replays of one trace — request rates x strategies x the other axes — and, given
service-level objectives, the highest request rate each strategy sustains (the vLLM paper's Fig. 12-13).

Each point is one deterministic replay (``sweep_points``), so points run anywhere in any order (``sweep_runners``:
inline, local worker processes, Ray tasks) and give the same answers.

Capacity search: for each curve (a strategy at one value of every other axis) the grid of ``rates`` brackets the
highest rate that meets every SLO (the last rate before the first one that fails); ``search_steps`` rounds of
bisection then narrow each bracket, every curve's next midpoint run together. A curve whose lowest rate fails
searches below it; one whose highest rate passes is reported as at least that rate.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from minipaged_cli.apps.sweep_points import Point, Settings, Work, prepare
from minipaged_cli.apps.sweep_runners import LocalRunner, RayRunner
from minipaged_cli.errors import InputError
from minipaged_cli.units import JSON_DECIMALS, rounded
from minipaged_cli.workloads.trace import Trace

# Each SLO's name on the command line -> the point's metric it bounds (seconds).
SLO_METRICS = {
    "normalized-latency": "normalized_latency_mean_s",
    "normalized-latency-p99": "normalized_latency_p99_s",
    "ttft": "ttft_mean_s",
    "ttft-p99": "ttft_p99_s",
    "tpot": "tpot_mean_s",
}


@dataclass(frozen=True)
class Axes:
    rates: tuple[float, ...]
    strategies: tuple[str, ...]
    models: tuple[str, ...] = ("qwen3-8b",)
    gpus: tuple[str, ...] = ("h200",)
    kv_memory: tuple[str | None, ...] = (None,)
    block_sizes: tuple[int, ...] = (16,)
    prefix_caching: tuple[bool, ...] = (False,)

    def points(self) -> list[Point]:
        return [Point(m, g, k, b, p, s, r) for m, g, k, b, p, s, r in itertools.product(
            self.models, self.gpus, self.kv_memory, self.block_sizes, self.prefix_caching, self.strategies,
            self.rates)]

    def varying(self) -> list[str]:
        """The Point fields with more than one value (besides strategy and rate), for labels."""
        values = {"model": self.models, "gpu": self.gpus, "kv_memory": self.kv_memory,
                  "block_size": self.block_sizes, "prefix_caching": self.prefix_caching}
        return [name for name, v in values.items() if len(v) > 1]


@dataclass(frozen=True)
class Slo:
    name: str  # a key of SLO_METRICS
    limit_s: float

    def met_by(self, row: dict[str, Any]) -> bool:
        value = row[SLO_METRICS[self.name]]
        return value is not None and value <= self.limit_s

    def __str__(self) -> str:
        return f"{self.name} <= {self.limit_s:g} s"


def parse_slo(text: str) -> Slo:
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or name not in SLO_METRICS:
        raise InputError(f"expected NAME=SECONDS with NAME one of {', '.join(SLO_METRICS)}", field="--slo",
                         value=text, has_value=True)
    try:
        limit = float(value)
    except ValueError:
        raise InputError("the limit must be a number of seconds", field="--slo", value=text, has_value=True) from None
    if not limit > 0:
        raise InputError("the limit must be > 0", field="--slo", value=text, has_value=True)
    return Slo(name, limit)


# -- the sweep and the capacity search -------------------------------------------------------------------------


@dataclass
class Capacity:
    curve: Point
    rate: float | None  # the highest rate known to meet every SLO; None: none does
    bracket: tuple[float, float | None]  # (meets, fails); fails None: the grid's top rate meets
    status: str  # "found", "none" (no rate meets) or "above grid" (the highest rate meets)

    def to_dict(self) -> dict[str, Any]:
        curve = {k: v for k, v in asdict(self.curve).items() if k != "rate"}
        bracket = [None if rate is None else round(rate, JSON_DECIMALS) for rate in self.bracket]
        return rounded({**curve, "capacity_rps": self.rate, "bracket": bracket, "status": self.status})


@dataclass
class SweepResult:
    axes: Axes
    settings: Settings
    rows: dict[Point, dict[str, Any]]
    slos: tuple[Slo, ...] = ()
    capacities: list[Capacity] | None = None

    def points(self) -> list[dict[str, Any]]:
        return [{**asdict(p), **self.rows[p]} for p in sorted(self.rows, key=Point.sort_key)]

    def ratios(self) -> list[dict[str, Any]]:
        """Paged's sustainable rate over each other strategy's, per panel: {strategy: {ratio, exact}}. Not exact
        (a lower bound) when paged still met the SLOs at the top of the grid; None when the other strategy met
        them nowhere, or at the top of the grid too (the grid says nothing then)."""
        out = []
        by_panel: dict[Point, dict[str, Capacity]] = {}
        for capacity in self.capacities or []:
            by_panel.setdefault(capacity.curve.panel, {})[capacity.curve.strategy] = capacity
        for panel, strategies in by_panel.items():
            paged = strategies.get("paged")
            if paged is None or paged.rate is None:
                continue
            ratios: dict[str, dict[str, Any]] = {}
            for name, other in strategies.items():
                if name == "paged":
                    continue
                known = other.rate is not None and other.status == "found"
                ratios[name] = {"ratio": round(paged.rate / other.rate, JSON_DECIMALS) if known else None,
                                "exact": known and paged.status == "found"}
            panel_axes = {k: v for k, v in asdict(panel).items() if k not in ("strategy", "rate")}
            out.append({**panel_axes, "paged_over": ratios})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"settings": asdict(self.settings), "slo": [str(s) for s in self.slos], "points": self.points(),
                "capacity": [c.to_dict() for c in self.capacities or []], "ratios": self.ratios()}


def sweep(trace: Trace, axes: Axes, settings: Settings, runner: LocalRunner | RayRunner,
          slos: tuple[Slo, ...] = (), search_steps: int = 5,
          progress: Callable[[int, int], None] | None = None, work: Work | None = None) -> SweepResult:
    """Every point of ``axes``; then, given SLOs, ``search_steps`` rounds of bisection per curve.
    ``progress(done, total)`` after each point (the total grows when a search round starts). ``work``: what
    ``prepare`` made of these arguments, when the caller checked them already."""
    points = axes.points()
    runner.start(work or prepare(trace, settings, points))
    try:
        return _sweep(axes, settings, runner, points, slos, search_steps, progress)
    finally:
        runner.close()


def _sweep(axes: Axes, settings: Settings, runner: LocalRunner | RayRunner, points: list[Point],
           slos: tuple[Slo, ...], search_steps: int, progress: Callable[[int, int], None] | None) -> SweepResult:
    rows: dict[Point, dict[str, Any]] = {}
    total = [len(points)]

    def run(batch: list[Point]) -> None:
        for point, row in runner.run(batch):
            rows[point] = row
            if progress is not None:
                progress(len(rows), total[0])

    run(points)
    result = SweepResult(axes, settings, rows, slos)
    if not slos:
        return result
    curves = sorted({p.curve for p in points}, key=Point.sort_key)
    brackets = {curve: _bracket(curve, rows, slos) for curve in curves}
    for _ in range(search_steps):
        # Within the grid a bracket is (meets, fails); below it, (0, the lowest rate, which fails).
        todo = {curve: (low + high) / 2 for curve, (low, high) in brackets.items() if high is not None}
        if not todo:
            break
        total[0] += len(todo)
        run([replace(curve, rate=mid) for curve, mid in todo.items()])
        for curve, mid in todo.items():
            low, high = brackets[curve]
            met = all(s.met_by(rows[replace(curve, rate=mid)]) for s in slos)
            brackets[curve] = (mid, high) if met else (low, mid)
    result.capacities = []
    for curve, (low, high) in brackets.items():
        status = "above grid" if high is None else ("found" if low > 0 else "none")
        result.capacities.append(Capacity(curve, low if low > 0 else None, (low, high), status))
    return result


def _bracket(curve: Point, rows: dict[Point, dict[str, Any]], slos: tuple[Slo, ...]) -> tuple[float, float | None]:
    """(the last grid rate meeting every SLO before the first that fails, that first failing rate)."""
    rates = sorted(p.rate for p in rows if p.curve == curve)
    low = 0.0
    for rate in rates:
        if not all(s.met_by(rows[replace(curve, rate=rate)]) for s in slos):
            return low, rate
        low = rate
    return low, None
