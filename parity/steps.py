"""What each engine decided, step by step, in one structure for both, and where two replays first differ.

A replay is a list of ``StepRecord``: the tokens each request got in the step, the requests preempted while the
step was scheduled and those that finished when it ran, the prefix-cache lookups of the requests it admitted, and
the KV blocks in use once it was scheduled (vLLM's ``kv_cache_usage``: cached-but-free blocks count as free).
Requests are named by their index in the trace (``"7"``); a parallel sample after the first is ``"7.1"``, ``"7.2"``.

A step is recorded when it schedules tokens or preempts a request; only a step that schedules tokens takes time.
This module imports nothing from vLLM: ``minipaged_steps`` replays minipaged, ``vllm_side`` replays vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.replay import Replay
from minipaged_cli.sim.scheduler import StepDecision
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Trace

# The fields two replays must agree on, step by step (times follow from them: both clocks run the same model).
COMPARED_FIELDS = ("scheduled", "preempted", "finished", "prefix_queries", "prefix_hits", "used_blocks")


@dataclass
class StepRecord:
    """One step of one engine. ``scheduled``: request -> tokens computed in the step, in the engine's order."""

    time_s: float
    scheduled: dict[str, int]
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    prefix_queries: int = 0  # prompt tokens looked up by first admissions (vLLM's prefix_cache_queries)
    prefix_hits: int = 0  # of those, tokens found cached
    used_blocks: int = 0
    duration_s: float = 0.0

    def compared(self) -> dict[str, Any]:
        """The compared fields, order-free where the order is not a decision (preemption and finish lists)."""
        values = {name: getattr(self, name) for name in COMPARED_FIELDS}
        values["preempted"] = sorted(self.preempted)
        values["finished"] = sorted(self.finished)
        return values


@dataclass
class ReplayRecord:
    """One engine's whole replay of a case."""

    steps: list[StepRecord]
    num_blocks: int

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_preemptions(self) -> int:
        return sum(len(s.preempted) for s in self.steps)

    @property
    def num_finished(self) -> int:
        return sum(len(s.finished) for s in self.steps)

    @property
    def scheduled_tokens(self) -> int:
        return sum(sum(s.scheduled.values()) for s in self.steps)

    @property
    def prefix_hit_rate(self) -> float:
        queries = sum(s.prefix_queries for s in self.steps)
        return sum(s.prefix_hits for s in self.steps) / queries if queries else 0.0

    @property
    def makespan_s(self) -> float:
        return self.steps[-1].time_s + self.steps[-1].duration_s if self.steps else 0.0

    @property
    def mean_usage(self) -> float:
        """Time-weighted fraction of the blocks in use after each step was scheduled."""
        busy = sum(s.duration_s for s in self.steps)
        return sum(s.used_blocks * s.duration_s for s in self.steps) / busy / self.num_blocks if busy else 0.0

    def totals(self) -> dict[str, float]:
        return {"steps": self.num_steps, "scheduled tokens": self.scheduled_tokens,
                "preemptions": self.num_preemptions, "finished": self.num_finished,
                "prefix hit rate": self.prefix_hit_rate, "mean usage": self.mean_usage,
                "makespan s": self.makespan_s}


def first_difference(ours: list[StepRecord], theirs: list[StepRecord]) -> int | None:
    """The index of the first step whose compared fields differ (or that only one replay has); None if equal."""
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a.compared() != b.compared():
            return index
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def first_difference_by_field(ours: list[StepRecord], theirs: list[StepRecord]) -> dict[str, int]:
    """For each compared field that ever differs, the first step where it does (one difference, in usage say,
    does not hide where the scheduling decisions part)."""
    found: dict[str, int] = {}
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        mine, other = a.compared(), b.compared()
        for name in COMPARED_FIELDS:
            if name not in found and mine[name] != other[name]:
                found[name] = index
    return found


@dataclass(frozen=True)
class ParityCase:
    """One trace under one engine configuration, as both replays take it. ``scheduler`` is minipaged's scheduling
    mode (``SimConfig.scheduler``): v1 is the one to compare; v0 shows where the old engine parts from vLLM."""

    trace: str
    trace_format: str = "auto"
    limit: int | None = None
    time_scale: float = 1.0
    rate: float | None = None
    seed: int = 0
    num_blocks: int = 2000
    block_size: int = 16
    max_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int | None = None
    prefix_caching: bool = False
    watermark: float = 0.0  # vLLM v1's default (config/scheduler.py)
    model: str = "qwen3-8b"
    gpu: str = "h200"
    scheduler: str = "v1"
    # vLLM 0.34.0's cache-aware admission (0: off, its default; only a 0.34.0 venv runs a case that sets it)
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5

    @property
    def label(self) -> str:
        parts = [Path(self.trace).name]
        if self.limit is not None:
            parts.append(f"--limit {self.limit}")
        if self.time_scale != 1.0:
            parts.append(f"--time-scale {self.time_scale:g}")
        if self.rate is not None:
            parts.append(f"--rate {self.rate:g}")
        parts += [f"{self.num_blocks} blocks", f"budget {self.max_batched_tokens}"]
        if self.max_num_seqs != 256:
            parts.append(f"{self.max_num_seqs} seqs")
        parts.append("prefix caching" if self.prefix_caching else "no prefix caching")
        if self.cache_aware_admission_window:
            parts.append(f"cache-aware window {self.cache_aware_admission_window} above "
                         f"{self.cache_aware_admission_threshold:g}")
        return ", ".join(parts)

    def load(self) -> tuple[Trace, SimConfig]:
        """The trace and minipaged's configuration (bad input raises ``InputError``)."""
        trace = load_trace(self.trace, self.trace_format, rate=self.rate, seed=self.seed, limit=self.limit,
                           time_scale=self.time_scale)
        config = SimConfig.of(model=load_model(self.model), gpu=load_gpu(self.gpu), num_blocks=self.num_blocks,
                              block_size=self.block_size, max_model_len=self.max_model_len,
                              max_num_seqs=self.max_num_seqs, max_batched_tokens=self.max_batched_tokens,
                              prefix_caching=self.prefix_caching, watermark=self.watermark,
                              scheduler=self.scheduler, cache_aware_admission_window=self.cache_aware_admission_window,
                              cache_aware_admission_threshold=self.cache_aware_admission_threshold)
        if config.model_len > config.kv_capacity_tokens:
            # vLLM refuses to start an engine whose pool cannot hold one request of max_model_len
            # (v1/core/kv_cache_planning.py::_check_enough_kv_cache_memory).
            blocks = config.cache.num_blocks
            raise InputError(f"vLLM will not start: {blocks} blocks of {config.block_size} tokens hold "
                             f"{config.kv_capacity_tokens} tokens, less than one request of max_model_len; lower "
                             "--max-model-len or raise --num-blocks", field="--max-model-len",
                             value=config.model_len, has_value=True)
        return trace, config


def request_key(request_index: int, sample: int) -> str:
    return str(request_index) if sample == 0 else f"{request_index}.{sample}"


def minipaged_steps(trace: Trace, config: SimConfig) -> ReplayRecord:
    """minipaged's paged replay, one step at a time, recorded by wrapping its scheduler's ``schedule`` and
    ``finish`` (the replay loop itself runs unchanged)."""
    replay = Replay(trace, config, config.allocator("paged"), bulk=False, progress=None)
    scheduler, accounting, manager = replay.scheduler, replay.accounting, replay.allocator.manager
    schedule, finish = scheduler.schedule, scheduler.finish
    steps: list[StepRecord] = []

    def keys(requests: list[LiveRequest]) -> list[str]:
        return [request_key(r.request_index, r.sample) for r in requests]

    def recorded_schedule() -> StepDecision | None:
        running = list(scheduler.running)
        queries, hits = accounting.prefix_cache_queries, accounting.prefix_cache_hits
        decision = schedule()
        # finish() runs at the end of every step, so whoever left the running list here was preempted
        preempted = keys([r for r in running if r not in scheduler.running])
        if decision is None and not preempted:
            return None
        scheduled: dict[str, int] = {}
        if decision is not None:
            scheduled.update((request_key(r.request_index, r.sample), 1) for r in decision.decoders)
            scheduled.update((request_key(r.request_index, r.sample), c) for r, c in decision.chunks)
        steps.append(StepRecord(replay.now, scheduled, preempted, [], accounting.prefix_cache_queries - queries,
                                accounting.prefix_cache_hits - hits, config.cache.num_blocks - manager.num_free_blocks))
        return decision

    def recorded_finish(now: float) -> None:
        running = list(scheduler.running)
        finish(now)
        steps[-1].finished = keys([r for r in running if r not in scheduler.running])
        steps[-1].duration_s = now - steps[-1].time_s

    scheduler.schedule, scheduler.finish = recorded_schedule, recorded_finish
    replay.run()
    return ReplayRecord(steps, config.cache.num_blocks)


class StepClock:
    """minipaged's own step time (``Replay._duration``: the step-time model on the batch's shape) for a batch
    described by (tokens computed before the step, tokens it computes) per request, so another engine's replay
    sees arrivals on the same clock."""

    def __init__(self, trace: Trace, config: SimConfig) -> None:
        self.replay = Replay(trace, config, config.allocator("paged"), bulk=False, progress=None)

    def seconds(self, decodes: list[int], chunks: list[tuple[int, int]]) -> float:
        """``decodes``: tokens computed before the step by each decoding request; ``chunks``: (tokens computed
        before, chunk tokens) of each prefill chunk."""
        decoders = [LiveRequest(i, 0, 0, num_computed=computed) for i, computed in enumerate(decodes)]
        prefills = [(LiveRequest(i, 0, 0, num_computed=computed), tokens) for i, (computed, tokens) in
                    enumerate(chunks)]
        return self.replay._duration(StepDecision(decoders, prefills))
