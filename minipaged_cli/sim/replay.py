"""Continuous-batching replay of a trace under one allocation strategy, and where the KV memory goes.

This module is the loop (Over 300 lines: the single step, the bulk fast path and what each hands a data plane or the
report read best side by side); the scheduler (``scheduler``) decides each step, the step-time model (``step_time``)
times it, and the accounting (``accounting``, ``categories``) measures it.

Each step the scheduler decides what runs (vLLM v1's policy or v0's, ``SimConfig.scheduler``); every decoding
request writes one token's KV and samples the next, every prefill chunk its tokens; finished requests free their
memory. Memory categories during a step: ``sim.categories`` defines them (they sum to the capacity). A request's
final length is prompt + output - 1: the last sampled token is never fed back, so its KV is never written.

Shared blocks (``paged`` only: prefix-cache hits, v0's forked samples) hold their tokens once, so the per-request
sums count ``allocator.shared_slots`` too many; that is taken off the token states and the allocated slots.

Stepping one decode step at a time costs Python work per token; between events (an arrival, a completion,
an admission, a prefill, a block the pool cannot give, an extent that must grow) nothing but lengths changes,
so ``replay`` advances all those steps at once and integrates the metrics over them (``bulk=False`` steps one
at a time, the reference the fast path is tested against). For a model with sliding windows ``simulate`` replays
the paged strategy once more with every layer as full attention (what the hybrid KV cache manager saves).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.memory.allocators import Allocator, BulkProfile, Holding
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.sim.accounting import Accounting, StrategyMetrics, current_categories
from minipaged_cli.sim.admission import AdmissionPolicy
from minipaged_cli.sim.categories import category_slots
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.layout import LayoutRecorder
from minipaged_cli.sim.scheduler import Scheduler, StepDecision
from minipaged_cli.sim.scheduler_v0 import V0Scheduler
from minipaged_cli.sim.session_report import session_metrics
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.sim.tiers import TieredCache
from minipaged_cli.validation import positive_number
from minipaged_cli.workloads.trace import Trace

SCHEDULER_CLASSES: dict[str, type[Scheduler]] = {"v1": Scheduler, "v0": V0Scheduler}
_MAX_BULK_STEPS = 4096
_MAX_BULK_CELLS = 1 << 16  # n requests * k steps in one bulk profile
_STEPS = np.arange(1, _MAX_BULK_STEPS + 1, dtype=np.int64)


@dataclass(frozen=True)
class StepWork:
    """What one step writes, for a data plane to execute: K/V of every new token, then decode attention.

    ``prefills``: (sequence_id, first position, number of tokens) of each prompt chunk; ``decodes``:
    (sequence_id, position) of the one token each decoding sequence writes and attends from (it attends to
    positions 0..position). ``live_tokens``: tokens held by running requests once the step has run, a token in
    a block several requests share counted once.
    ``copies``: (src, dst) blocks that copy-on-write needs copied before any token is written.
    ``forks``: (parent, child) sequences forked after the step's prefill (the child attends to the parent's
    prompt until it writes its own tokens).
    ``loads``: (block hash, GPU block id) filled from a tier below the GPU (host memory, disk) before this step's
    compute; ``stores``: (block hash, GPU block id) copied down to the host tier after this step's compute
    (``sim/tiers.py``). Under ``--offload-policy on-eviction`` the stored blocks are the ones this step's
    allocation evicts: their old content must be copied before the step's compute overwrites it.
    """

    prefills: list[tuple[int, int, int]]
    decodes: list[tuple[int, int]]
    live_tokens: int
    copies: list[tuple[int, int]] = field(default_factory=list)
    forks: list[tuple[int, int]] = field(default_factory=list)
    loads: list[tuple[Hashable, int]] = field(default_factory=list)
    stores: list[tuple[Hashable, int]] = field(default_factory=list)


class Replay:
    """One strategy's replay of a trace: the scheduler's steps, timed and measured, one at a time or, between
    events, many decode steps at once."""

    def __init__(self, trace: Trace, config: SimConfig, allocator: Allocator, bulk: bool,
                 progress: Callable[[int], None] | None,
                 on_step: Callable[[StepWork, Allocator], None] | None = None,
                 max_steps: int | None = None) -> None:
        self.trace = trace
        self.config = config
        self.allocator = allocator
        self.bulk = bulk
        self.progress = progress
        self.on_step = on_step
        self.max_steps = max_steps
        self.accounting = Accounting(allocator.capacity_tokens, config.model.kv_bytes_per_token,
                                     config.record_timeline)
        self.scheduler = SCHEDULER_CLASSES[config.scheduler](trace, config, allocator, self.accounting)
        self.step_time = StepTimeModel(config.model, config.gpu, config.calibration)
        self.tiers = self.scheduler.tiers = TieredCache.under(allocator, config, self.step_time)
        self.now = 0.0
        self.layout = LayoutRecorder(allocator.capacity_tokens, (trace.requests[-1].arrival_s - self.first_arrival_s)
                                     / 400 or 0.01) if config.record_layout else None

    @property
    def first_arrival_s(self) -> float:
        """The first request's arrival (a fleet's replica is handed its requests as the replay runs; one sent none
        measures from 0)."""
        requests = self.scheduler.arrivals.requests
        return requests[0].arrival_s if requests else 0.0

    def run(self) -> StrategyMetrics:
        while self.scheduler.has_work:
            if self.max_steps is not None and self.accounting.num_steps >= self.max_steps:
                break
            self.iterate()
        return self.metrics()

    def iterate(self) -> None:
        """One pass of the loop: queue what has arrived, then run a step (or a bulk advance), or idle to the next
        arrival. ``run`` calls it while there is work; a fleet's replica (``fleet/replica.py``) until a time."""
        scheduler, accounting = self.scheduler, self.accounting
        scheduler.arrive(self.now)
        if not scheduler.running and not scheduler.waiting:
            if scheduler.next_arrival_s is not None:  # idle until the next arrival
                self.now = max(self.now, scheduler.next_arrival_s)
            return
        if not (self.bulk and self._bulk_step()):
            self._single_step()
        if self.config.check_invariants:
            accounting.invariant_violations += bool(self.allocator.invariant_violations()
                                                    or (self.tiers is not None and self.tiers.violations()))
        if self.layout is not None:
            self.layout.maybe_record(self.now, self.allocator)
        if self.progress is not None:
            self.progress(accounting.num_done)

    def metrics(self) -> StrategyMetrics:
        """The replay's report so far (all of it once ``run`` returns)."""
        metrics = self.accounting.metrics(self.allocator, self.first_arrival_s)
        if self.tiers is not None:
            metrics.tiers = self.tiers.metrics(self.accounting.prefix_cache_queries, metrics.makespan_s)
        if self.layout is not None:
            metrics.layout = self.layout.result()
        if self.trace.sessions or self.config.clients.kind != "open":
            metrics.sessions = session_metrics(self.trace, self.scheduler.arrivals, self.config.clients,
                                               metrics.makespan_s)
        return metrics

    def _single_step(self) -> None:
        scheduler = self.scheduler
        decision = scheduler.schedule()
        if decision is None:
            self._start_copies()
            self.now = scheduler.idle_until(self.now)
            return
        decoders, chunks = decision.decoders, decision.chunks
        duration = self._duration(decision)
        running = scheduler.running
        stores, loads = self._copies(self.now + duration)
        if self.on_step is not None:
            work = StepWork(prefills=[(r.sequence_id, r.num_computed, c) for r, c in chunks],
                            decodes=[(r.sequence_id, r.num_computed) for r in decoders],
                            live_tokens=sum(r.num_computed for r in running) + decision.num_new_tokens
                            - self.allocator.shared_slots,
                            copies=decision.copies, forks=decision.forks, loads=loads, stores=stores)
            self.on_step(work, self.allocator)
        for live in decoders:
            live.num_computed += 1
            live.num_generated += 1
        for live, chunk in chunks:
            live.num_computed += chunk
            if live.prefill_done:
                live.num_generated += 1
                if live.first_token_s is None:
                    live.first_token_s = self.now + duration
        categories = current_categories(running, self.allocator, self.scheduler.external_fragmentation())
        self.accounting.record(self.now, duration, duration * categories, decision.saturated, 1, len(running))
        self.accounting.note_busiest(running, self.allocator.used_slots)
        self.now += duration
        for live, _ in chunks:
            if live.prefill_done:
                self.scheduler.prefilled(live, self.now)
        self.scheduler.finish(self.now)

    def _duration(self, decision: StepDecision) -> float:
        """The step's time (``sim/step_time.py``), with the copies over the host link before its forward added:
        timed by the host tier's link clock when there is one, else the swapped bytes at the link's bandwidth."""
        decoders, chunks = decision.decoders, decision.chunks
        seconds = self.step_time.step_seconds(
            new_tokens=decision.num_new_tokens, sequences=len(decoders) + len(chunks),
            prefill_tokens=sum(c for _, c in chunks),
            prefill_attended=sum(c * r.num_computed + c * (c + 1) / 2 for r, c in chunks),
            prefill_context=sum(r.num_computed + c for r, c in chunks),
            decodes=len(decoders), decode_context=sum(r.num_computed + 1 for r in decoders),
            copied_tokens=decision.copied_tokens)
        transfer = self.step_time.swap_seconds(decision.swapped_tokens) if self.tiers is None else decision.transfer_s
        return _checked_seconds(float(seconds) + transfer)

    def _bulk_step(self) -> bool:
        """Advance several decode-only steps at once; False when this step needs the single-step path."""
        scheduler = self.scheduler
        if not scheduler.can_bulk:
            return False  # (nothing running and a head that does not fit: the single step rejects it)
        if self.allocator.windowed and self.allocator.shared_slots:
            return False  # a shared block leaving a window changes the shared slots, which a bulk advance holds
        running = scheduler.running
        n = len(running)
        lengths = np.fromiter((r.num_computed for r in running), dtype=np.int64, count=n)
        num_steps = min(min(r.output_tokens - r.num_generated for r in running), _MAX_BULK_STEPS,
                        max(1, _MAX_BULK_CELLS // n))
        total_length = int(lengths.sum())
        # Tokens the queries of each step attend to, their own included: total_length + n * j for j = 1..k.
        contexts = np.arange(total_length + n, total_length + n * (num_steps + 1), n, dtype=np.int64)
        durations = self.step_time.step_seconds(new_tokens=n, sequences=n, decodes=n, decode_context=contexts)
        _checked_seconds(float(durations.min()))  # (a NaN anywhere makes the min NaN)
        if scheduler.next_arrival_s is not None:
            # Stop before the step that starts at or after the next arrival: it may admit that request.
            ends = self.now + durations.cumsum()
            num_steps = 1 + int(ends[:-1].searchsorted(scheduler.next_arrival_s, side="left"))
        allocated = np.fromiter((self.allocator.allocated(r) for r in running), dtype=np.int64, count=n)
        finals = np.fromiter((r.final_length for r in running), dtype=np.int64, count=n)
        profile = self.allocator.bulk_profile(lengths, allocated, finals, num_steps)
        num_steps = profile.num_steps
        if num_steps == 0:
            return False

        # Saturation is decided per step, as the single step does after its growth: the queue's head is held
        # back in the steps whose new blocks eat its headroom. Without sliding windows free space only shrinks
        # here, so that is one run from the first held step on; windows free blocks too, so it comes and goes.
        external = scheduler.external_fragmentation()
        peak_used = None  # (where windows free blocks the peak may come before the last step; else the end's)
        if self.allocator.windowed:
            grown = profile.allocated - int(allocated.sum())  # slots taken since the start: per step, or one number
            if scheduler.waiting:
                grown = np.broadcast_to(grown, num_steps)
                headroom = scheduler.admission_headroom()
                held_back = grown > headroom
                if headroom < 0 and not held_back.all():
                    num_steps = int(np.argmin(held_back))  # windows freed enough for the head: that step admits it
                    if num_steps == 0:
                        return False
                    held_back = held_back[:num_steps]
                changes = np.flatnonzero(held_back[1:] != held_back[:-1]) + 1 if held_back.any() else ()
                for start, stop in itertools.pairwise([0, *changes, num_steps]):
                    self._record_bulk(profile, durations, total_length, n, external, start, stop,
                                      bool(held_back[start]))
                duration = float(durations[:num_steps].sum())
            else:  # nothing waits: nothing is held back
                duration = self._record_bulk(profile, durations, total_length, n, external, 0, num_steps, False)
            peak_used = self.allocator.used_slots + (int(grown[:num_steps].max()) if isinstance(grown, np.ndarray)
                                                     else grown)
        else:
            num_free = num_steps
            if scheduler.waiting:
                grown = np.broadcast_to(profile.allocated, num_steps) - int(allocated.sum())
                num_free = int(grown.searchsorted(scheduler.admission_headroom(), side="right"))
            if 0 < num_free < num_steps:
                self._record_bulk(profile, durations, total_length, n, external, 0, num_free, False)
                self._record_bulk(profile, durations, total_length, n, external, num_free, num_steps, True)
                duration = float(durations[:num_steps].sum())
            else:  # one run, all saturated or none: its duration is the advance's
                duration = self._record_bulk(profile, durations, total_length, n, external, 0, num_steps,
                                             num_free == 0)
        self.allocator.advance(running, num_steps)
        for live in running:
            live.num_computed += num_steps
            live.num_generated += num_steps
        self.accounting.note_busiest(running, self.allocator.used_slots if peak_used is None else peak_used,
                                     total_length + n * num_steps)
        self.now += _checked_seconds(duration)  # (an infinity anywhere shows in the sum)
        if self.tiers is not None:
            self.tiers.flush(self.now, pairs=False)  # (bulk steps run only without a data plane)
        scheduler.finish(self.now)
        return True

    def _start_copies(self) -> None:
        """A scheduling that runs nothing still starts the copies it issued: the loads of the requests it
        admitted (all of them loading) and the stores of the blocks their allocations evicted (vLLM's scheduler
        hands its connector the loads in a step of no tokens, and the worker starts them)."""
        if self.tiers is None:
            return
        stores, loads = self._copies(self.now)
        if self.on_step is not None and (loads or stores):
            live = sum(r.num_computed for r in self.scheduler.running) - self.allocator.shared_slots
            self.on_step(StepWork(prefills=[], decodes=[], live_tokens=live, loads=loads, stores=stores),
                         self.allocator)

    def _copies(self, at: float) -> tuple[list[tuple[Hashable, int]], list[tuple[Hashable, int]]]:
        """The stores issued at ``at`` (the tiers' flush) and the loads the scheduling issued, for a data plane."""
        stores = [] if self.tiers is None else self.tiers.flush(at, pairs=self.on_step is not None)
        loads, self.scheduler.loads = self.scheduler.loads, []
        return stores, loads

    def _record_bulk(self, profile: BulkProfile, durations: np.ndarray, total_length: int, n: int, external: int,
                     start: int, stop: int, saturated: bool) -> float:
        """Record steps ``start`` to ``stop`` of a bulk advance: time integrals of the category inputs (the shared
        slots stay constant: no admission, fork or release until the last step). Returns their duration."""
        part = durations[start:stop]
        duration = float(part.sum())
        tokens = total_length * duration + n * float(part @ _STEPS[start:stop]) if profile.tokens is None \
            else _integral(profile.tokens, part, duration, start, stop)
        slots = category_slots(
            tokens,
            _integral(profile.allocated, part, duration, start, stop),
            _integral(profile.internal, part, duration, start, stop),
            external * duration,
            self.allocator.capacity_tokens * duration,
            self.allocator.shared_slots * duration,
        )
        began = self.now + float(durations[:start].sum()) if start else self.now
        self.accounting.record(began, duration, slots, saturated, stop - start, n)
        return duration


def _checked_seconds(seconds: float) -> float:
    """A step time (or a sum of them) as the model gave it, refused unless finite and positive: a NaN never
    advances the clock (the replay would hang) and a zero step time makes throughput infinite."""
    if 0.0 < seconds < math.inf:  # the common case, without the validator's call
        return seconds
    return positive_number(seconds, field="step time (s)", source="the step-time model (--gpu preset or --calibration)")


def _integral(values: np.ndarray | int, durations: np.ndarray, duration: float, start: int, stop: int) -> float:
    """Σ durations * values over steps ``start`` to ``stop`` of a ``BulkProfile`` series (per step, or one
    constant: then no array is built)."""
    return float(values[start:stop] @ durations) if isinstance(values, np.ndarray) else values * duration


def check_capacity(trace: Trace, config: SimConfig, strategies: tuple[str, ...]) -> None:
    """Bad input, before any replay: no request fits max_model_len, or a strategy can place none of them."""
    fitting = [r for r in trace.requests if r.total_tokens <= config.model_len]
    if not fitting:
        shortest = min(r.total_tokens for r in trace.requests)
        raise InputError(f"every request is longer (the shortest holds {shortest} tokens); raise it",
                         field="--max-model-len", value=config.model_len, has_value=True)
    admission = AdmissionPolicy.for_engine(config.scheduler, config.watermark_blocks)
    for name in strategies:
        allocator = config.allocator(name)
        # The first request the strategy can place ends its check (holdings built for a whole trace, per strategy,
        # cost more than the replay of a short one).
        needs = []
        for request in fitting:
            holding = Holding(0, request.prompt_tokens, request.output_tokens)
            if admission.rejection_reason(allocator, holding) is None:
                break
            needs.append(allocator.largest_need(holding))
        else:
            smallest = min(needs)
            hint = " or lower --max-model-len" if name == "max-reserve" else ""
            # (v1 holds the watermark only while something runs: a request alone may use the whole pool)
            watermark = f" above the {config.watermark:g} watermark" \
                if config.watermark and name == "paged" and config.scheduler == "v0" else ""
            raise InputError(f"the KV capacity of {allocator.capacity_tokens} tokens{watermark} is too small for any "
                             f"request under {name} (the smallest needs {smallest}); raise --kv-memory or "
                             f"--num-blocks{hint}", field="--kv-memory")


@dataclass
class SimulationResult:
    """Every strategy's metrics on one trace and one capacity; ``to_dict`` is the ``--json`` document."""

    trace: Trace
    config: SimConfig
    strategies: dict[str, StrategyMetrics]
    # With tiers below the GPU: the strategies they apply to, replayed again without them (what they buy)
    without_tiers: dict[str, StrategyMetrics] = field(default_factory=dict)
    # Sliding windows under the hybrid manager: paged again, every layer as full attention, on the same memory
    all_full_attention: tuple[SimConfig, StrategyMetrics] | None = None

    def to_dict(self) -> dict[str, Any]:
        config = self.config
        document = {
            "trace": {"name": self.trace.name, "num_requests": self.trace.num_requests,
                      "prompt_tokens": self.trace.prompt_tokens, "output_tokens": self.trace.output_tokens},
            "config": {"model": config.model.name, "gpu": config.gpu.name, "block_size": config.block_size,
                       "num_blocks": config.num_blocks, "kv_capacity_tokens": config.kv_capacity_tokens,
                       "kv_cache_dtype": config.model.kv_cache_dtype,
                       "kv_bytes_per_token": config.model.kv_bytes_per_token, "max_model_len": config.model_len,
                       "scheduler": config.scheduler, "max_num_seqs": config.max_num_seqs,
                       "max_batched_tokens": config.max_batched_tokens,
                       "long_prefill_token_threshold": config.long_prefill_token_threshold,
                       "prefix_caching": config.prefix_caching, "preemption": config.preemption,
                       "cpu_blocks": config.cpu_blocks, "watermark": config.watermark,
                       "calibration": config.calibration.path if config.calibration else None,
                       **(config.tier_settings if config.has_tiers else {})},
            "strategies": {name: metrics.to_dict() for name, metrics in self.strategies.items()},
        }
        if config.model.is_hybrid:  # (--no-hybrid-kv: every layer as full attention, one group)
            document["config"]["hybrid_kv"] = config.hybrid_kv
        if self.all_full_attention is not None:
            full_config, full = self.all_full_attention
            document["config"].update(kv_cache_groups=len(config.kv_cache_groups), kv_size_tokens=config.kv_size_tokens)
            document["paged_all_full_attention"] = {"num_blocks": full_config.num_blocks,
                                                    "kv_size_tokens": full_config.kv_size_tokens, **full.to_dict()}
        if self.without_tiers:  # (the documents of replays without tiers keep their keys)
            document["without_tiers"] = {name: metrics.to_dict() for name, metrics in self.without_tiers.items()}
        return document


def simulate(
    trace: Trace,
    config: SimConfig,
    strategies: tuple[str, ...] = STRATEGIES,
    *,
    progress: Callable[[str, int], None] | None = None,
) -> SimulationResult:
    """Replay ``trace`` under each strategy on the same capacity. ``progress(strategy, requests_done)``."""
    for name in strategies:
        _check_strategy(name)
    check_capacity(trace, config, strategies)
    results = {}
    for name in strategies:
        report = functools.partial(progress, name) if progress is not None else None
        results[name] = replay(trace, config, name, progress=report)
    without = {name: replay(trace, config.without_tiers(), name) for name, metrics in results.items() if metrics.tiers}
    all_full = None
    if "paged" in strategies and config.hybrid_kv and config.model.is_hybrid:
        full_config = config.all_full_attention()
        all_full = (full_config, replay(trace, full_config, "paged"))
    return SimulationResult(trace, config, results, without, all_full)


def replay(
    trace: Trace,
    config: SimConfig,
    strategy: str,
    *,
    bulk: bool = True,
    progress: Callable[[int], None] | None = None,
    on_step: Callable[[StepWork, Allocator], None] | None = None,
    max_steps: int | None = None,
) -> StrategyMetrics:
    """Replay ``trace`` under one strategy. ``progress`` gets the number of requests done so far.

    ``on_step`` is called after every step's allocation with the tokens the step writes (and the allocator,
    whose block manager holds their slots): the data plane executes them. It implies one step at a time.
    ``max_steps`` ends the replay early; the metrics then cover the steps that ran.
    """
    _check_strategy(strategy)
    return Replay(trace, config, config.allocator(strategy), bulk and on_step is None, progress, on_step,
                  max_steps).run()


def _check_strategy(name: str) -> None:
    if name not in STRATEGIES:
        raise InputError(f"unknown strategy{did_you_mean(name, STRATEGIES)}; expected some of "
                         f"{', '.join(STRATEGIES)}", field="--strategies", value=name, has_value=True)
