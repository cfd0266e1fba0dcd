"""Continuous-batching replay of a trace under one allocation strategy, and where the KV memory goes.

``Replay`` is the loop: the scheduler (``scheduler``) decides each step, the step-time model (``step_time``) times
it, and the accounting (``accounting``, ``categories``) measures it. Between events the loop advances many decode
steps at once (``bulk_advance``); a data plane is handed each step's ``StepWork`` (``step_work``). ``simulate``
replays every strategy on one capacity.

Each step the scheduler decides what runs (vLLM v1's policy or v0's, ``SimConfig.scheduler``); every decoding
request writes one token's KV and samples the next, every prefill chunk its tokens; finished requests free their
memory. Memory categories during a step: ``sim.categories`` defines them (they sum to the capacity). A request's
final length is prompt + output - 1: the last sampled token is never fed back, so its KV is never written.

Shared blocks (``paged`` only: prefix-cache hits, v0's forked samples) hold their tokens once, so the per-request
sums count ``allocator.shared_slots`` too many; that is taken off the token states and the allocated slots.

For a model with sliding windows ``simulate`` replays the paged strategy once more with every layer as full
attention (what the hybrid KV cache manager saves).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.memory.allocators import Allocator, Holding
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.sim.accounting import Accounting, StrategyMetrics, current_categories
from minipaged_cli.sim.admission import AdmissionPolicy
from minipaged_cli.sim.bulk_advance import BulkAdvance
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.scheduler import Scheduler, StepDecision
from minipaged_cli.sim.scheduler_v0 import V0Scheduler
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.sim.step_work import StepWork, checked_seconds
from minipaged_cli.workloads.trace import Trace

if TYPE_CHECKING:
    from minipaged_cli.sim.layout import LayoutRecorder
    from minipaged_cli.sim.tiers import TieredCache

SCHEDULER_CLASSES: dict[str, type[Scheduler]] = {"v1": Scheduler, "v0": V0Scheduler}


class Replay:
    """One strategy's replay of a trace: the scheduler's steps, timed and measured, one at a time or, between
    events, many decode steps at once."""

    def __init__(self, trace: Trace, config: SimConfig, allocator: Allocator, bulk: bool,
                 progress: Callable[[int], None] | None,
                 on_step: Callable[[StepWork, Allocator], None] | None = None, max_steps: int | None = None) -> None:
        self.trace, self.config, self.allocator, self.bulk = trace, config, allocator, bulk
        self.progress, self.on_step, self.max_steps = progress, on_step, max_steps
        self.accounting = Accounting(allocator.capacity_tokens, config.model.kv_bytes_per_token,
                                     config.outputs.record_timeline)
        self.scheduler = SCHEDULER_CLASSES[config.engine.scheduler](
            trace, config.engine, config.cache, allocator, self.accounting, model_len=config.model_len,
            clients=config.clients, swap_blocks=config.swap_blocks, watermark_blocks=config.watermark_blocks)
        if on_step is not None:  # (it reads the allocator, the blocks' keys too: ``sim/private_keys.py``)
            self.scheduler.shared_segments = None
        self.step_time = StepTimeModel(config.model, config.gpu, config.calibration)
        self.tiers: TieredCache | None = None
        if config.tiers.has_tiers:  # (tiers.py and what it uses: imported by the replays with tiers)
            from minipaged_cli.sim.tiers import TieredCache
            self.tiers = self.scheduler.tiers = TieredCache.under(allocator, config, self.step_time)
        self.bulk_advance = BulkAdvance(self.scheduler, allocator, self.step_time, self.accounting)
        self.passes = self.scheduler.passes  # (a step's passes over its running requests: ``request_loops``)
        self.now = 0.0
        self.layout: LayoutRecorder | None = None
        if config.outputs.record_layout:  # (layout.py and session_report.py: imported by the replays that use them)
            from minipaged_cli.sim.layout import LayoutRecorder
            self.layout = LayoutRecorder(allocator.capacity_tokens,
                                         (trace.requests[-1].arrival_s - self.first_arrival_s) / 400 or 0.01)
        # (tiers time their copies by the passes, a layout samples at them, a step cap counts them)
        self.bulk_advance.through_arrivals = self.tiers is None and self.layout is None and max_steps is None

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
        if self.config.outputs.check_invariants:
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
            from minipaged_cli.sim.session_report import session_metrics

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
                            copies=decision.copies, forks=decision.forks, loads=loads, stores=stores,
                            tiers=self.tiers)
            self.on_step(work, self.allocator)
        self.passes.advance(decoders, 1)
        for live, chunk in chunks:
            live.num_computed += chunk
            if live.prefill_done:
                live.num_generated += 1
                if live.first_token_s is None:
                    live.first_token_s = self.now + duration
        live_tokens = self.passes.computed_total(running)
        categories = current_categories(running, self.allocator, self.scheduler.external_fragmentation(),
                                        live_tokens)
        self.accounting.record(self.now, duration, [duration * slots for slots in categories], decision.saturated,
                               1, len(running))
        self.accounting.note_busiest(running, self.allocator.used_slots, live_tokens)
        self.now += duration
        for live, _ in chunks:
            if live.prefill_done:
                self.scheduler.prefilled(live, self.now)
        self.scheduler.finish(self.now)

    def _duration(self, decision: StepDecision) -> float:
        """The step's time (``sim/step_time.py``), with the copies over the host link before its forward added:
        timed by the host tier's link clock when there is one, else the swapped bytes at the link's bandwidth."""
        decoders, chunks = decision.decoders, decision.chunks
        prefill_tokens = prefill_attended = prefill_context = 0  # (one pass: a step has a chunk or two)
        for live, chunk in chunks:
            prefill_tokens += chunk
            prefill_attended += chunk * live.num_computed + chunk * (chunk + 1) / 2
            prefill_context += live.num_computed + chunk
        seconds = self.step_time.step_seconds(
            new_tokens=len(decoders) + prefill_tokens, sequences=len(decoders) + len(chunks),
            prefill_tokens=prefill_tokens, prefill_attended=prefill_attended, prefill_context=prefill_context,
            decodes=len(decoders), decode_context=self.passes.computed_total(decoders) + len(decoders),
            copied_tokens=decision.copied_tokens)
        transfer = self.step_time.swap_seconds(decision.swapped_tokens) if self.tiers is None else decision.transfer_s
        return checked_seconds(float(seconds) + transfer)

    def _bulk_step(self) -> bool:
        """Advance several decode-only steps at once (``BulkAdvance``); False when this step needs the single-step
        path."""
        end = self.bulk_advance.advance(self.now)
        if end is None:
            return False
        self.now = end
        if self.tiers is not None:
            self.tiers.flush(self.now, pairs=False)  # (bulk steps run only without a data plane)
        self.scheduler.finish(self.now)
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
            self.on_step(StepWork(prefills=[], decodes=[], live_tokens=live, loads=loads, stores=stores,
                                  tiers=self.tiers), self.allocator)

    def _copies(self, at: float) -> tuple[list[tuple[Hashable, int]], list[tuple[Hashable, int]]]:
        """The stores issued at ``at`` (the tiers' flush) and the loads the scheduling issued, for a data plane."""
        stores = [] if self.tiers is None else self.tiers.flush(at, pairs=self.on_step is not None)
        loads, self.scheduler.loads = self.scheduler.loads, []
        return stores, loads


def check_capacity(trace: Trace, config: SimConfig, strategies: tuple[str, ...]) -> None:
    """Bad input, before any replay: no request fits max_model_len, or a strategy can place none of them."""
    fitting = [r for r in trace.requests if r.total_tokens <= config.model_len]
    if not fitting:
        shortest = min(r.total_tokens for r in trace.requests)
        raise InputError(f"every request is longer (the shortest holds {shortest} tokens); raise it",
                         field="{max_model_len}", value=config.model_len, has_value=True)
    admission = AdmissionPolicy.for_engine(config.engine.scheduler, config.watermark_blocks)
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
            hint = " or lower {max_model_len}" if name == "max-reserve" else ""
            # (v1 holds the watermark only while something runs: a request alone may use the whole pool)
            watermark = f" above the {config.engine.watermark:g} watermark" \
                if config.engine.watermark and name == "paged" and config.engine.scheduler == "v0" else ""
            raise InputError(f"the KV capacity of {allocator.capacity_tokens} tokens{watermark} is too small for any "
                             f"request under {name} (the smallest needs {smallest}); raise {{kv_memory}} or "
                             f"{{num_blocks}}{hint}", field="{kv_memory}")


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
        config, engine = self.config, self.config.engine
        document = {
            "trace": {"name": self.trace.name, "num_requests": self.trace.num_requests,
                      "prompt_tokens": self.trace.prompt_tokens, "output_tokens": self.trace.output_tokens},
            "config": {"model": config.model.name, "gpu": config.gpu.name, "block_size": config.block_size,
                       "num_blocks": config.cache.num_blocks, "kv_capacity_tokens": config.kv_capacity_tokens,
                       "kv_cache_dtype": config.model.kv_cache_dtype,
                       "kv_bytes_per_token": config.model.kv_bytes_per_token, "max_model_len": config.model_len,
                       "scheduler": engine.scheduler, "max_num_seqs": engine.max_num_seqs,
                       "max_batched_tokens": engine.max_batched_tokens,
                       "long_prefill_token_threshold": engine.long_prefill_token_threshold,
                       "prefix_caching": config.cache.prefix_caching, "preemption": engine.preemption,
                       "cpu_blocks": config.cache.cpu_blocks, "watermark": engine.watermark,
                       "calibration": config.calibration.path if config.calibration else None,
                       **(config.tiers.to_dict() if config.tiers.has_tiers else {})},
            "strategies": {name: metrics.to_dict() for name, metrics in self.strategies.items()},
        }
        if config.model.is_hybrid:  # (--no-hybrid-kv: every layer as full attention, one group)
            document["config"]["hybrid_kv"] = config.cache.hybrid_kv
        if self.all_full_attention is not None:
            full_config, full = self.all_full_attention
            document["config"].update(kv_cache_groups=len(config.kv_cache_groups), kv_size_tokens=config.kv_size_tokens)
            document["paged_all_full_attention"] = {"num_blocks": full_config.cache.num_blocks,
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
    if "paged" in strategies and config.cache.hybrid_kv and config.model.is_hybrid:
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
                         f"{', '.join(STRATEGIES)}", field="{strategies}", value=name, has_value=True)
