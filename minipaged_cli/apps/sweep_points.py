"""A sweep's points: one replay each, the trace re-timed by a seeded Poisson process at the point's rate (the
same seed at every rate, so the rates differ only in scale), under one strategy, model, GPU, KV memory, block
size and prefix-caching setting. Deterministic: the same point gives the same row wherever it runs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from minipaged_cli.errors import InputError
from minipaged_cli.sim.calibration import Calibration, load_calibration
from minipaged_cli.sim.config import SimConfig, resolve_num_blocks
from minipaged_cli.sim.replay import check_capacity, replay
from minipaged_cli.units import rounded
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Trace


@dataclass(frozen=True)
class Settings:
    """What every point shares."""

    seed: int = 0
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_batched_tokens: int | None = None
    watermark: float = 0.01
    preemption: str = "recompute"
    cpu_blocks: int = 0
    gpu_memory_utilization: float = 0.9
    calibration: str | None = None  # a path: it must match the one GPU of the sweep


@dataclass(frozen=True)
class Point:
    model: str
    gpu: str
    kv_memory: str | None  # None: gpu_memory_utilization of the GPU minus the weights
    block_size: int
    prefix_caching: bool
    strategy: str
    rate: float

    @property
    def curve(self) -> Point:
        """The point with its rate zeroed: every point of one latency-against-rate curve shares it."""
        return replace(self, rate=0.0)

    @property
    def panel(self) -> Point:
        """The curve with its strategy blanked: the curves drawn (and compared) together."""
        return replace(self, strategy="", rate=0.0)

    def sort_key(self) -> tuple[Any, ...]:
        """Points in a stable order (the GPU's default KV memory, None, first)."""
        return (self.model, self.gpu, self.kv_memory is not None, self.kv_memory or "", self.block_size,
                self.prefix_caching, self.strategy, self.rate)


@dataclass(frozen=True)
class Work:
    """What a worker needs for any point: the trace, the seed, and each curve's configuration, resolved here
    (presets and calibration files are read once, by the caller, so workers need no ``configs/``)."""

    trace: Trace
    seed: int
    configs: dict[Point, SimConfig]


def prepare(trace: Trace, settings: Settings, points: Iterable[Point]) -> Work:
    """Every curve's configuration, and bad input found before any replay runs (a worker's error would come
    back as a crash)."""
    calibration = load_calibration(settings.calibration) if settings.calibration else None
    configs: dict[Point, SimConfig] = {}
    for point in points:
        if not point.rate > 0:
            raise InputError("must be > 0", field="--rates", value=point.rate, has_value=True)
        if point.curve not in configs:
            configs[point.curve] = config = _config(point, settings, calibration)
            check_capacity(trace, config, (point.strategy,))
    return Work(trace, settings.seed, configs)


def _config(point: Point, settings: Settings, calibration: Calibration | None) -> SimConfig:
    model, gpu = load_model(point.model), load_gpu(point.gpu)
    num_blocks, _ = resolve_num_blocks(model, gpu.memory_bytes, point.block_size, None, point.kv_memory,
                                       settings.gpu_memory_utilization)
    return SimConfig(model=model, gpu=gpu, num_blocks=num_blocks, block_size=point.block_size,
                     max_model_len=settings.max_model_len, max_num_seqs=settings.max_num_seqs,
                     max_batched_tokens=settings.max_batched_tokens, prefix_caching=point.prefix_caching,
                     preemption=settings.preemption, cpu_blocks=settings.cpu_blocks, watermark=settings.watermark,
                     calibration=calibration)


def run_point(work: Work, point: Point) -> dict[str, Any]:
    """One replay: the metrics of a sweep row."""
    metrics = replay(work.trace.with_poisson_arrivals(point.rate, work.seed), work.configs[point.curve],
                     point.strategy)
    return rounded({
        "normalized_latency_mean_s": metrics.mean_normalized_latency_s,
        "normalized_latency_p99_s": metrics.p99_normalized_latency_s,
        "ttft_mean_s": metrics.mean_ttft_s,
        "ttft_p99_s": metrics.p99_ttft_s,
        "tpot_mean_s": metrics.mean_tpot_s,
        "mean_batch_size": metrics.mean_batch_size,
        "throughput_tokens_per_s": metrics.throughput_tokens_per_s,
        "num_preemptions": metrics.num_preemptions,
        "token_state_pct": metrics.token_state_pct,
        "completed_requests": metrics.completed_requests,
        "rejected_requests": metrics.rejected_requests,
    })
