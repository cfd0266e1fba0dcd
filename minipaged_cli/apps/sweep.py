"""``minipaged sweep``: many replays of one trace — request rates x strategies x the other axes — and, given
service-level objectives, the highest request rate each strategy sustains (the vLLM paper's Fig. 12-13).

Each point is one or more deterministic replays (``sweep_points``: one per arrival seed, their metrics averaged),
so replays run anywhere in any order (``sweep_runners``: inline, local worker processes, Ray tasks) and give the
same answers.

Capacity search. A curve (a strategy at one value of every other axis) **sustains** a rate r when every SLO holds
at r and at every tested rate below r: the first failure caps the capacity, whatever passes above it. The answer
is the highest such rate to three significant digits (..., 3.24, 3.25, 3.26, ...): the grid of ``rates`` brackets
it (the highest rate meeting every SLO below the lowest that fails), then bisection over the three-digit rates
inside the bracket (every curve's next midpoint run together) narrows it until no three-digit rate is left
between its ends, or ``search_steps`` rounds are spent. On a curve whose latency grows with the rate, the answer
is then the same whatever the grid: the highest three-digit rate at which the SLOs hold. A tested rate that meets
the SLOs above one that fails is reported (``non_monotone``): there the answer depends on the rates tested. A
curve whose lowest rate fails searches below it; one whose highest rate passes is reported as at least that rate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from minipaged_cli.apps.sweep_points import ALL_FULL_ATTENTION, Point, Replay, Settings, Work, mean_row, prepare
from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import DEFAULT_BLOCK_SIZE
from minipaged_cli.units import JSON_DECIMALS, rounded
from minipaged_cli.validation import positive_number
from minipaged_cli.workloads.trace import Trace

if TYPE_CHECKING:  # the runners (process pools, Ray) load when sweep runs, not with the CLI
    from minipaged_cli.apps.sweep_runners import LocalRunner, RayRunner

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
    block_sizes: tuple[int, ...] = (DEFAULT_BLOCK_SIZE,)
    prefix_caching: tuple[bool, ...] = (False,)
    cpu_kv_memory: tuple[str | None, ...] = (None,)
    offload_policies: tuple[str, ...] = ("write-through",)
    tier_evictions: tuple[str, ...] = ("lru",)
    tier_inclusions: tuple[str, ...] = ("inclusive",)
    replicas: tuple[int, ...] = (1,)  # fleets of paged replicas (fleet/): each count > 1 behind each router
    routers: tuple[str, ...] = ("round-robin",)
    concurrency: tuple[int, ...] = (0,)  # closed-loop clients; 0: open loop at each rate
    max_concurrency: tuple[int, ...] = (0,)  # open loop at each rate, capped at that many in flight; 0: no cap
    # Models whose paged curve is swept again with every layer as full attention (``all_full_attention_models``)
    all_full_models: tuple[str, ...] = ()

    def points(self) -> list[Point]:
        """Every combination of the axes, less exclusive tiers under write-through (they need on-eviction)."""
        points = [Point(m, g, k, b, p, s, r, c, o, e, i, concurrency=n, max_concurrency=x)
                  for m, g, k, b, p, c, o, e, i, n, x, s, r in
                  itertools.product(self.models, self.gpus, self.kv_memory, self.block_sizes, self.prefix_caching,
                                    self.cpu_kv_memory, self.offload_policies, self.tier_evictions,
                                    self.tier_inclusions, self.concurrency, self.max_concurrency, self.strategies,
                                    self.rates)
                  if not (i == "exclusive" and o != "on-eviction")]
        points = [replace(p, replicas=count, router=router) for p in points for count in self.replicas
                  for router in (self.routers if count > 1 else ("",)) if count == 1 or p.strategy == "paged"]
        return points + [replace(point, strategy=ALL_FULL_ATTENTION) for point in points
                         if point.strategy == "paged" and point.model in self.all_full_models]

    @property
    def curve_strategies(self) -> tuple[str, ...]:
        """The strategies of the curves drawn: those swept, and paged with every layer full where it is."""
        return self.strategies + ((ALL_FULL_ATTENTION,) if self.all_full_models else ())

    def varying(self) -> list[str]:
        """The Point fields with more than one value (besides strategy and rate), for labels."""
        values = {"model": self.models, "gpu": self.gpus, "kv_memory": self.kv_memory,
                  "block_size": self.block_sizes, "prefix_caching": self.prefix_caching,
                  "cpu_kv_memory": self.cpu_kv_memory, "offload_policy": self.offload_policies,
                  "tier_eviction": self.tier_evictions, "tier_inclusion": self.tier_inclusions,
                  "replicas": self.replicas, "router": self.routers, "concurrency": self.concurrency,
                  "max_concurrency": self.max_concurrency}
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
    """``--slo NAME=SECONDS``."""
    name, sep, value = str(text).partition("=")
    if not sep or name.strip() not in SLO_METRICS:
        raise InputError(f"expected NAME=SECONDS with NAME one of {', '.join(SLO_METRICS)}", field="{slo}",
                         value=text, has_value=True)
    try:
        limit: Any = float(value)
    except ValueError:
        limit = value.strip()  # refused below as not a number
    return make_slo(name.strip(), limit, field="{slo}")


def make_slo(name: str, limit: Any, *, field: str, source: str | None = None) -> Slo:
    """An SLO from its name and limit, wherever they were written (``field``, ``source`` name the place)."""
    if name not in SLO_METRICS:
        raise InputError(f"unknown SLO; expected one of {', '.join(SLO_METRICS)}", source=source, field=field,
                         value=name, has_value=True)
    return Slo(name, positive_number(limit, field=field, source=source))


# -- the capacity search --------------------------------------------------------------------------------------

SEARCH_STEPS = 12  # bisection rounds at most: enough to resolve a bracket spanning four decades to three digits
_DIGITS = 3  # the search's resolution, in significant digits
_PER_DECADE = 9 * 10 ** (_DIGITS - 1)  # three-digit mantissas 100 ... 999


def lattice_index(rate: float, *, round_up: bool = False) -> int:
    """The index of the three-significant-digit rate at or below ``rate`` (at or above with ``round_up``) in the
    increasing sequence of them: index i is (100 + i mod 900) x 10^(i div 900)."""
    exponent = math.floor(math.log10(rate)) - (_DIGITS - 1)
    mantissa = rate / 10.0**exponent  # in [100, 1000), up to the division's rounding ...
    slack = mantissa * 1e-9  # ... which must not move 2.01 (200.99999999999997) down to 2.00
    whole = math.ceil(mantissa - slack) if round_up else math.floor(mantissa + slack)
    return exponent * _PER_DECADE + whole - 10 ** (_DIGITS - 1)


def lattice_rate(index: int) -> float:
    """The three-significant-digit rate of ``lattice_index``."""
    exponent, offset = divmod(index, _PER_DECADE)
    return float(f"{10 ** (_DIGITS - 1) + offset}e{exponent}")  # the decimal, exactly as printed


@dataclass
class Capacity:
    curve: Point
    rate: float | None  # the sustainable rate (three digits); None: no tested rate meets every SLO
    bracket: tuple[float, float | None]  # (meets, fails); fails None: the grid's top rate meets
    status: str  # "found", "none" (no rate meets) or "above grid" (the highest rate meets)
    # Where the tested rates show latency falling as the rate grows: (a rate failing the SLOs, the next tested
    # rate, which meets them), in order; empty when the curve looks monotone.
    non_monotone: tuple[tuple[float, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        curve = {k: v for k, v in asdict(self.curve).items() if k != "rate"}
        bracket = [None if rate is None else round(rate, JSON_DECIMALS) for rate in self.bracket]
        non_monotone = [{"fails_at": fails, "meets_at": meets} for fails, meets in self.non_monotone]
        return rounded({**curve, "capacity_rps": self.rate, "bracket": bracket, "status": self.status,
                        "non_monotone": non_monotone})


@dataclass
class CurveSearch:
    """One curve's capacity search: whether each tested rate met every SLO. The bracket, the next rate to test
    and the answer all follow from those outcomes, whatever order they came in."""

    curve: Point
    met: dict[float, bool] = field(default_factory=dict)

    def record(self, rate: float, met: bool) -> None:
        self.met[rate] = met

    @property
    def bracket(self) -> tuple[float, float | None]:
        """(the highest rate meeting every SLO below the lowest that fails, or 0; that lowest failing rate, or
        None when every tested rate meets them)."""
        fails = min((rate for rate, met in self.met.items() if not met), default=None)
        meets = [rate for rate, met in self.met.items() if met and (fails is None or rate < fails)]
        return max(meets, default=0.0), fails

    def next_rate(self) -> float | None:
        """The three-digit rate halfway through those left inside the bracket; None when none is left, or the
        bracket has no top (every rate met the SLOs: the grid's top bounds the search)."""
        low, high = self.bracket
        if high is None:
            return None
        if low == 0.0:  # no rate met the SLOs: halve the lowest
            return lattice_rate(lattice_index(high / 2))
        first, last = lattice_index(low) + 1, lattice_index(high, round_up=True) - 1
        return lattice_rate((first + last) // 2) if first <= last else None

    def capacity(self) -> Capacity:
        low, high = self.bracket
        status = "above grid" if high is None else ("found" if low > 0 else "none")
        rate = lattice_rate(lattice_index(low)) if low > 0 else None
        tested = sorted(self.met.items())
        falls = tuple((lower, higher) for (lower, lower_met), (higher, higher_met) in itertools.pairwise(tested)
                      if not lower_met and higher_met)  # latency falls from one tested rate to the next
        return Capacity(self.curve, rate, (low, high), status, falls)


# -- the sweep -------------------------------------------------------------------------------------------------


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
        return {"settings": self.settings.to_dict(), "slo": [str(s) for s in self.slos], "points": self.points(),
                "capacity": [c.to_dict() for c in self.capacities or []], "ratios": self.ratios()}


def sweep(trace: Trace, axes: Axes, settings: Settings, runner: LocalRunner | RayRunner,
          slos: tuple[Slo, ...] = (), search_steps: int = SEARCH_STEPS,
          progress: Callable[[int, int], None] | None = None, work: Work | None = None) -> SweepResult:
    """Every point of ``axes``; then, given SLOs, up to ``search_steps`` rounds of bisection per curve.
    ``progress(done, total)`` after each replay (the total grows when a search round starts). ``work``: what
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
    seeds = range(settings.seed, settings.seed + settings.seeds)
    done, total = [0], [0]

    def run(batch: list[Point]) -> None:
        sharing: dict[Point, list[Point]] = {}  # per Point.replay_key, the points of one replay (the first runs)
        for point in batch:
            sharing.setdefault(point.replay_key, []).append(point)
        total[0] += len(sharing) * len(seeds)
        replays: dict[Point, dict[int, dict[str, Any]]] = {group[0]: {} for group in sharing.values()}
        for job, metrics in runner.run([Replay(group[0], seed) for group in sharing.values() for seed in seeds]):
            replays[job.point][job.seed] = metrics
            if len(replays[job.point]) == len(seeds):  # averaged in seed order, wherever they ran
                row = mean_row([replays[job.point][seed] for seed in seeds])
                rows.update((point, dict(row)) for point in sharing[job.point.replay_key])
            done[0] += 1
            if progress is not None:
                progress(done[0], total[0])

    def record(batch: list[Point]) -> None:
        for point in batch:
            searches[point.curve].record(point.rate, all(slo.met_by(rows[point]) for slo in slos))

    run(points)
    result = SweepResult(axes, settings, rows, slos)
    if not slos:
        return result
    searches = {curve: CurveSearch(curve) for curve in sorted({p.curve for p in points}, key=Point.sort_key)}
    record(points)
    for _ in range(search_steps):
        todo = [replace(curve, rate=rate) for curve, search in searches.items()
                if (rate := search.next_rate()) is not None]
        if not todo:
            break
        run(todo)
        record(todo)
    result.capacities = [search.capacity() for search in searches.values()]
    return result
