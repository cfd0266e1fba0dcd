"""A sweep's points: replays of the trace re-timed by a seeded Poisson process at the point's rate (the same
seeds at every rate, so the rates differ only in scale), under one strategy, model, GPU, KV memory, block size and
prefix-caching setting, and host tier under the prefix cache (its size, offload and eviction policies), on one
engine (vLLM v1 or v0 scheduling). Deterministic: the same replay gives the same metrics wherever it runs; a
point's row is the mean of its replays' metrics, one per arrival seed."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from minipaged_cli.errors import InputError
from minipaged_cli.fleet.config import FleetConfig, ReplicaPool, RouterConfig
from minipaged_cli.sim.calibration import Calibration, load_calibration
from minipaged_cli.sim.clients import Clients
from minipaged_cli.sim.config import (
    CONCERNS,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    SimConfig,
    default_prefix_caching,
    resolve_hybrid_kv,
)
from minipaged_cli.sim.kv_sizing import resolve_num_blocks, tier_blocks
from minipaged_cli.sim.replay import check_capacity, replay
from minipaged_cli.sim.settings import EngineSettings
from minipaged_cli.units import parse_bytes, rounded
from minipaged_cli.validation import whole_number
from minipaged_cli.workloads.presets import load_gpu, load_model, with_kv_cache_dtype
from minipaged_cli.workloads.trace import Trace

# The settings (SimConfig.of's names) a sweep may give, every point the same; the rest are a point's own (model, GPU,
# capacity, block size, prefix caching), the calibration's (read once), or diagnostics.
ENGINE_FIELDS = ("scheduler", "max_model_len", "max_num_seqs", "max_batched_tokens", "watermark", "preemption",
                 "cpu_blocks", "hybrid_kv")
# The paged strategy once more with every layer as full attention on the same KV memory, beside a sliding-window
# model's hybrid manager (what ``simulate`` replays as ``paged_all_full_attention``): what the manager buys in
# requests/s, as one more curve of the panel.
ALL_FULL_ATTENTION = "paged-all-full"


@dataclass(frozen=True)
class Settings:
    """What every point shares. ``engine``: settings by name (``SimConfig.of``; names from ENGINE_FIELDS); one left out
    keeps SimConfig's default, so the engine's defaults are written in one place."""

    seed: int = 0  # the first arrival seed
    seeds: int = 1  # arrival seeds seed, seed + 1, ...: a point's metrics are the mean over their replays
    gpu_memory_utilization: float | None = DEFAULT_GPU_MEMORY_UTILIZATION  # None: the vLLM release's
    calibration: str | None = None  # a path: it must match the one GPU of the sweep
    kv_cache_dtype: str = "auto"  # every model's KV cache element type (with_kv_cache_dtype)
    engine: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.engine) - set(ENGINE_FIELDS))
        assert not unknown, f"not engine settings a sweep gives: {unknown}"
        whole_number(self.seeds, field="{seeds}", minimum=1)

    def to_dict(self) -> dict[str, Any]:
        """Every setting, the engine's as given or else SimConfig's default (None where SimConfig resolves it)."""
        defaults = {f.name: None if f.default is MISSING else f.default
                    for kind in (SimConfig, *CONCERNS.values()) for f in fields(kind)}
        return {"seed": self.seed, "seeds": self.seeds, **{name: self.engine.get(name, defaults[name])
                                                            for name in ENGINE_FIELDS},
                "gpu_memory_utilization": self.gpu_memory_utilization, "calibration": self.calibration,
                "kv_cache_dtype": self.kv_cache_dtype}

    @property
    def hybrid_manager(self) -> bool:
        """Whether the hybrid KV cache manager runs: as given, else the engine's default (on under v1)."""
        return resolve_hybrid_kv(self.engine.get("hybrid_kv"), self.engine.get("scheduler", EngineSettings.scheduler))

    def engine_prefix_caching(self) -> bool:
        """Prefix caching where the sweep leaves it out: the engine's default (v1 on, v0 off), as SimConfig
        resolves it, so that ``sweep`` and ``simulate`` agree."""
        return default_prefix_caching(self.engine.get("scheduler", EngineSettings.scheduler))  # (the field's default)


@dataclass(frozen=True)
class Point:
    model: str
    gpu: str
    kv_memory: str | None  # None: gpu_memory_utilization of the GPU minus the weights
    block_size: int
    prefix_caching: bool
    strategy: str
    rate: float
    cpu_kv_memory: str | None = None  # the host tier under the prefix cache (sim/tiers.py); None or 0: none
    offload_policy: str = "write-through"
    tier_eviction: str = "lru"
    tier_inclusion: str = "inclusive"
    # A fleet of this many paged replicas behind ``router`` (fleet/); one replica is the engine alone (no router)
    replicas: int = 1
    router: str = ""
    concurrency: int = 0  # closed-loop clients (sim/clients.py); 0: open loop at the point's rate
    max_concurrency: int = 0  # open loop at the point's rate, at most this many in flight; 0: no cap

    @property
    def curve(self) -> Point:
        """The point with its rate zeroed: every point of one latency-against-rate curve shares it."""
        return replace(self, rate=0.0)

    @property
    def panel(self) -> Point:
        """The curve with its strategy blanked: the curves drawn (and compared) together."""
        return replace(self, strategy="", rate=0.0)

    def sort_key(self) -> tuple[Any, ...]:
        """Points in a stable order (the GPU's default KV memory, None, first; host tiers by size)."""
        return (self.model, self.gpu, self.kv_memory is not None, self.kv_memory or "", self.block_size,
                self.prefix_caching, self.host_bytes, self.offload_policy, self.tier_eviction, self.tier_inclusion,
                self.replicas, self.router, self.concurrency, self.max_concurrency, self.strategy, self.rate)

    @property
    def replay_key(self) -> Point:
        """Points with one key share one replay: without a host tier the tiers' policies change nothing, so the
        key leaves them out."""
        key = replace(self, rate=0.0) if self.concurrency else self  # (closed-loop clients ignore arrival times)
        if key.host_bytes:
            return key
        return replace(key, offload_policy="", tier_eviction="", tier_inclusion="")

    @property
    def replayed_strategy(self) -> str:
        """The allocation strategy the point's replays run (the all-full curve's is paged)."""
        return "paged" if self.strategy == ALL_FULL_ATTENTION else self.strategy

    @property
    def host_bytes(self) -> int:
        """The host tier's size in bytes (0: none)."""
        return parse_bytes(self.cpu_kv_memory or "0", field="{cpu_kv_memory}", allow_zero=True)


@dataclass(frozen=True)
class Replay:
    """One replay of a point: the trace re-timed at the point's rate by the Poisson process of ``seed``."""

    point: Point
    seed: int


@dataclass(frozen=True)
class Work:
    """What a worker needs for any replay: the trace and each curve's configuration, resolved here (presets and
    calibration files are read once, by the caller, so workers need no ``configs/``)."""

    trace: Trace
    configs: dict[Point, SimConfig]


def prepare(trace: Trace, settings: Settings, points: Iterable[Point]) -> Work:
    """Every curve's configuration, and bad input found before any replay runs (a worker's error would come
    back as a crash)."""
    calibration = load_calibration(settings.calibration) if settings.calibration else None
    configs: dict[Point, SimConfig] = {}
    for point in points:
        if not point.rate > 0:
            raise InputError("must be > 0", field="{rates}", value=point.rate, has_value=True)
        if point.curve not in configs:
            configs[point.curve] = config = _config(point, settings, calibration)
            check_capacity(trace, config, (point.replayed_strategy,))
    return Work(trace, configs)


def _config(point: Point, settings: Settings, calibration: Calibration | None) -> SimConfig:
    model, gpu = with_kv_cache_dtype(load_model(point.model), settings.kv_cache_dtype), load_gpu(point.gpu)
    num_blocks, _, _ = resolve_num_blocks(model, gpu, point.block_size, None, point.kv_memory,
                                          settings.gpu_memory_utilization, hybrid=settings.hybrid_manager,
                                          max_num_batched_tokens=settings.engine.get("max_batched_tokens"),
                                          max_num_seqs=settings.engine.get("max_num_seqs"))
    config = SimConfig.of(model, gpu, num_blocks, block_size=point.block_size, prefix_caching=point.prefix_caching,
                          calibration=calibration,
                          cpu_kv_blocks=tier_blocks(point.cpu_kv_memory, model, point.block_size, "{cpu_kv_memory}",
                                                    hybrid=settings.hybrid_manager),
                          offload_policy=point.offload_policy, tier_eviction=point.tier_eviction,
                          tier_inclusion=point.tier_inclusion,
                          clients=Clients(concurrency=point.concurrency or None,
                                          max_concurrency=point.max_concurrency or None),
                          **settings.engine)
    return config.all_full_attention() if point.strategy == ALL_FULL_ATTENTION else config


def all_full_attention_models(models: Iterable[str], strategies: Collection[str],
                              settings: Settings) -> tuple[str, ...]:
    """The models whose paged curve is swept once more with every layer as full attention: those with sliding
    windows, when the hybrid manager runs and paged is swept."""
    if not settings.hybrid_manager or "paged" not in strategies:
        return ()
    return tuple(name for name in models if load_model(name).is_hybrid)


def run_replay(work: Work, job: Replay) -> dict[str, float | int | None]:
    """One replay: the metrics of a sweep row, unrounded (``mean_row`` averages and rounds them); a fleet point's
    from the fleet's totals, which carry the engine's names."""
    point = job.point
    trace, config = work.trace.with_poisson_arrivals(point.rate, job.seed), work.configs[point.curve]
    if point.replicas > 1:
        from minipaged_cli.fleet.fleet import run_fleet  # the fleet loads with the first point that has replicas

        pool = ReplicaPool("replicas", point.replicas, config)
        figures = run_fleet(trace, FleetConfig((pool,), RouterConfig(point.router))).to_dict()
    else:
        metrics = replay(trace, config, point.replayed_strategy)
        tiers = {name: {"hit_pct": tier.hit_pct} for name, tier in metrics.tiers.items()}
        figures = {**metrics.measurements(), "tiers": tiers}
    return {
        "normalized_latency_mean_s": figures["mean_normalized_latency_s"],
        "normalized_latency_p99_s": figures["p99_normalized_latency_s"],
        "ttft_mean_s": figures["mean_ttft_s"],
        "ttft_p99_s": figures["p99_ttft_s"],
        "tpot_mean_s": figures["mean_tpot_s"],
        "mean_batch_size": figures["mean_batch_size"],
        "throughput_tokens_per_s": figures["throughput_tokens_per_s"],
        "num_preemptions": figures["num_preemptions"],
        "token_state_pct": figures["token_state_pct"],
        "prefix_cache_hit_pct": figures["prefix_cache_hit_pct"],  # found on the GPU, of the prompt tokens
        # loaded from the tiers under it
        "tier_hit_pct": sum(tier["hit_pct"] for tier in figures.get("tiers", {}).values()),
        "completed_requests": figures["completed_requests"],
        "rejected_requests": figures["rejected_requests"],
    }


def mean_row(replays: list[dict[str, float | int | None]]) -> dict[str, Any]:
    """A point's row: each metric's mean over its replays (None where any replay has none, e.g. no request
    completed), rounded for ``--json``. One replay's metrics pass through unchanged."""
    if len(replays) == 1:
        return rounded(replays[0])
    values = {name: [metrics[name] for metrics in replays] for name in replays[0]}
    return rounded({name: None if None in column else sum(column) / len(column)  # type: ignore[arg-type]
                    for name, column in values.items()})
