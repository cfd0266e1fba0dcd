"""What a replay measures: where the KV memory went (the categories of ``categories``, integrated over step time)
and how requests were served (completions, rejections, preemptions, latency, prefix-cache and swap counters).

The scheduler and the replay loop report events here; ``metrics`` turns them into the numbers ``simulate``,
``profile`` and ``run`` print.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.sim.categories import CATEGORIES, USED, category_slots
from minipaged_cli.sim.latencies import Latencies, percentile
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.units import rounded


@dataclass
class ReplayDetail:
    """Measurements beyond ``simulate``'s table, for ``profile``: time integrals over busy steps and the shape
    of the busiest step."""

    running_time_s: float  # Σ duration * running requests
    unused_slot_time_s: float  # Σ duration * Σ (allocated - length): the tails of the live allocations
    allocated_slot_time_s: float  # Σ duration * allocated slots
    busiest_seq_lens: list[int]  # lengths of the decoding requests when the most tokens were live
    peak_used_slots: int
    num_block_allocations: int  # paged: blocks taken from the free queue, ever (0 for contiguous strategies)
    num_block_frees: int

    @property
    def mean_unused_slots_per_request(self) -> float:
        return self.unused_slot_time_s / self.running_time_s if self.running_time_s else 0.0


@dataclass
class StrategyMetrics:
    """What one strategy did with the trace. Percentages are of the KV capacity, 0-100.

    Where vLLM's Prometheus metrics have a name, the field has it (without the ``vllm:`` prefix and the unit
    suffix): ``kv_cache_usage_perc`` (1 - free / (num_gpu_blocks - 1) at each instant, cached-but-free blocks
    counted free, here time-weighted as scrapes of the gauge average it; ``kv_cache_usage_peak_perc`` its
    highest sample), ``num_preemptions``, ``prefix_cache_queries`` / ``prefix_cache_hits`` (tokens),
    ``*_ttft_s`` (time_to_first_token), ``mean_tpot_s`` (request_time_per_output_token), ``*_e2e_s``
    (e2e_request_latency).
    """

    token_state_pct: float
    reserved_future_pct: float
    internal_frag_pct: float
    external_frag_pct: float
    free_pct: float
    averaged_over: str  # "saturated" (steps with a request waiting for memory) or "busy" (all steps)
    kv_cache_usage_perc: float
    kv_cache_usage_peak_perc: float
    completed_requests: int
    rejected_requests: int
    num_preemptions: int
    mean_batch_size: float
    max_batch_size: int
    throughput_tokens_per_s: float
    makespan_s: float
    mean_ttft_s: float | None  # None (JSON null) when no request completed: there is nothing to average
    p99_ttft_s: float | None
    mean_tpot_s: float | None  # None also when every completed request produced one token
    mean_e2e_s: float | None  # arrival to the last token of the request's last sample, over completed requests
    p99_e2e_s: float | None
    # End-to-end latency (arrival to its last sample's last token) / output tokens, over completed requests: the
    # vLLM paper's normalized latency (s/token).
    mean_normalized_latency_s: float | None
    p99_normalized_latency_s: float | None
    invariant_violations: int
    rejection_reasons: dict[str, int] = field(default_factory=dict)  # reason -> requests
    prefix_cache_queries: int = 0  # prompt tokens looked up at first admission (re-prefills are not queries)
    prefix_cache_hits: int = 0  # of those, tokens found cached
    prefix_cache_hit_pct: float = 0.0
    num_evictions: int = 0  # cached blocks the pool handed out again
    num_copy_on_writes: int = 0
    num_swaps: int = 0  # preemptions by swapping out (the rest recompute)
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    tiers: dict[str, Any] = field(default_factory=dict)  # name -> sim.tiers.TierMetrics, with tiers below the GPU
    sessions: Any = None  # sim.session_report.SessionMetrics, with sessions or clients other than open
    timeline: dict[str, list[float]] = field(default_factory=dict, repr=False)
    detail: ReplayDetail | None = field(default=None, repr=False)
    layout: Any = field(default=None, repr=False)  # sim.layout.LayoutSamples, when the config asks for it

    def measurements(self) -> dict[str, Any]:
        """The reported values, unrounded: every field but the tiers, the timeline, the detail and the layout."""
        return {k: v for k, v in self.__dict__.items()
                if k not in ("tiers", "timeline", "detail", "layout", "sessions")}

    def to_dict(self) -> dict[str, Any]:
        document = rounded(self.measurements())
        if self.tiers:  # (replays without tiers keep their keys)
            document["tiers"] = {name: tier.to_dict() for name, tier in self.tiers.items()}
        if self.sessions is not None:
            document["sessions"] = self.sessions.to_dict()
        return document


class MemoryIntegrator:
    """Step-duration-weighted sums of the memory categories over saturated steps and over all busy steps (lists of
    Python floats, added to element by element; attributes, not a dict of the two: added to at every step)."""

    def __init__(self) -> None:
        self.saturated_weight = self.busy_weight = 0.0
        self.saturated_sums = [0.0] * (len(CATEGORIES) + 1)
        self.busy_sums = [0.0] * (len(CATEGORIES) + 1)

    def add(self, duration: float, integrals: Sequence[float], saturated: bool) -> None:
        """``integrals``: Σ duration * slots over the steps, per category and (last) allocated slots (one number each:
        ``category_slots``' six)."""
        if saturated:
            self.saturated_weight += duration
            self.saturated_sums = list(map(operator.add, self.saturated_sums, integrals))  # (C's loop)
        self.busy_weight += duration
        self.busy_sums = list(map(operator.add, self.busy_sums, integrals))

    def averages(self, capacity: int) -> tuple[str, np.ndarray]:
        key, sums, weight = ("saturated", self.saturated_sums, self.saturated_weight) if self.saturated_weight > 0 \
            else ("busy", self.busy_sums, self.busy_weight)
        if weight == 0:  # nothing ever ran: all memory stayed free
            return key, np.array(category_slots(0, 0, 0, 0, 100.0), dtype=np.float64)
        averages = 100.0 * np.array(sums, dtype=np.float64) / weight / capacity
        return key, np.where(np.abs(averages) < 1e-9, 0.0, averages)  # no "-0.0" from rounding


def current_categories(running: Sequence[LiveRequest], allocator: Allocator, external: int,
                       live_tokens: int | None = None) -> tuple[float, ...]:
    """The memory categories now, in slots, for the running requests (``category_slots``'s layout).
    ``live_tokens``: Σ of their computed tokens, where the caller has it."""
    if allocator.windowed:  # a token's K/V in each group that holds it; the tail past F in each group
        allocated = sum(allocator.allocations(running))
        tokens = sum(allocator.token_slots(r, r.num_computed) for r in running)
        internal = sum(allocator.internal_slots(r) for r in running)
    else:
        allocated, internal = allocator.allocation_sums(running)
        tokens = live_tokens if live_tokens is not None else sum(r.num_computed for r in running)
    return category_slots(tokens, allocated, internal, external, allocator.capacity_tokens, allocator.shared_slots)


class Accounting:
    """The running totals of one replay."""

    def __init__(self, capacity_tokens: int, kv_bytes_per_token: int, record_timeline: bool) -> None:
        self.capacity_tokens = capacity_tokens
        self.kv_bytes_per_token = kv_bytes_per_token
        self.integrator = MemoryIntegrator()
        self.record_timeline = record_timeline
        self.timeline: dict[str, list[float]] = {"time_s": [], **{c: [] for c in CATEGORIES}}
        self.num_steps = 0
        self.batch_size_sum = 0
        self.max_batch_size = 0
        self.running_time = 0.0  # Σ duration * running requests
        self.peak_tokens = -1
        self.busiest_seq_lens: list[int] = []
        self.peak_used_slots = 0
        self.latencies = Latencies()
        # request index -> its sequences not yet finished or rejected, while it has any
        self.samples_left: dict[int, int] = {}
        self.num_completed = 0
        self.rejected: set[int] = set()  # request indices
        self.rejection_reasons: dict[str, int] = {}
        self.num_preemptions = 0
        self.num_swaps = 0
        self.swap_out_tokens = 0
        self.swap_in_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.invariant_violations = 0

    @property
    def num_done(self) -> int:
        """Requests completed or rejected: the replay's progress."""
        return self.num_completed + len(self.rejected)

    # -- steps -----------------------------------------------------------------------------------------------

    def record(self, now: float, duration: float, integrals: Sequence[float], saturated: bool, num_steps: int,
               batch_size: int) -> None:
        """Steps lasting ``duration`` in all, from ``now``; ``integrals``: Σ duration * slots per category."""
        self.integrator.add(duration, integrals, saturated)
        self.running_time += duration * batch_size
        self.num_steps += num_steps
        self.batch_size_sum += num_steps * batch_size
        if batch_size > self.max_batch_size:
            self.max_batch_size = batch_size
        if self.record_timeline:
            self.timeline["time_s"].append(now)
            for name, value in zip(CATEGORIES, integrals, strict=False):
                self.timeline[name].append(100.0 * value / duration / self.capacity_tokens)

    def note_busiest(self, running: Sequence[LiveRequest], used_slots: int, live_tokens: int | None = None) -> None:
        """Keep the decoding lengths of the step with the most live tokens (the end of a bulk advance)."""
        if used_slots > self.peak_used_slots:
            self.peak_used_slots = used_slots
        if live_tokens is None:
            live_tokens = sum(r.num_computed for r in running)
        if live_tokens > self.peak_tokens:
            self.peak_tokens = live_tokens
            self.busiest_seq_lens = [r.num_computed for r in running if r.prefill_done]

    # -- requests --------------------------------------------------------------------------------------------

    def arrived(self, request_index: int, num_samples: int) -> None:
        self.samples_left[request_index] = num_samples

    def sample_done(self, live: LiveRequest, now: float) -> None:
        samples_left = self._count_done(live)
        self.latencies.sample_done(live, now, samples_left, live.request_index in self.rejected)

    def rejected_sample(self, live: LiveRequest, reason: str) -> None:
        """``live`` is rejected; under v0 before its samples were forked, they never will be: all are done."""
        if live.request_index not in self.rejected:
            self.rejected.add(live.request_index)
            self.rejection_reasons[reason] = self.rejection_reasons.get(reason, 0) + 1
            self.latencies.rejected(live.request_index)
        self._count_done(live, 1 if live.forked else live.request.n)

    def _count_done(self, live: LiveRequest, sequences: int = 1) -> int:
        """``sequences`` of the request's sequences are done; returns how many it has left (0: the request is
        done)."""
        index = live.request_index
        left = self.samples_left.pop(index) - sequences
        if left:
            self.samples_left[index] = left
        elif index not in self.rejected:
            self.num_completed += 1
        return left

    # -- the result --------------------------------------------------------------------------------------------

    def metrics(self, allocator: Allocator, first_arrival_s: float) -> StrategyMetrics:
        counters = allocator.counters()
        averaged_over, averages = self.integrator.averages(self.capacity_tokens)
        busy = self.integrator.busy_sums
        latencies = self.latencies
        firsts, tpots = np.frombuffer(latencies.ttft_s), np.frombuffer(latencies.tpot_s)
        e2e, normalized = latencies.request_latencies()
        makespan = latencies.last_finish_s - first_arrival_s if latencies.last_finish_s is not None else 0.0
        output_tokens = latencies.output_tokens
        return StrategyMetrics(
            token_state_pct=float(averages[0]),
            reserved_future_pct=float(averages[1]),
            internal_frag_pct=float(averages[2]),
            external_frag_pct=float(averages[3]),
            free_pct=float(averages[4]),
            averaged_over=averaged_over,
            kv_cache_usage_perc=float(averages[USED]),
            kv_cache_usage_peak_perc=100.0 * self.peak_used_slots / self.capacity_tokens,
            completed_requests=self.num_completed,
            rejected_requests=len(self.rejected),
            num_preemptions=self.num_preemptions,
            mean_batch_size=self.batch_size_sum / self.num_steps if self.num_steps else 0.0,
            max_batch_size=self.max_batch_size,
            throughput_tokens_per_s=output_tokens / makespan if makespan > 0 else 0.0,
            makespan_s=makespan,
            mean_ttft_s=float(np.mean(firsts)) if firsts.size else None,
            p99_ttft_s=percentile(firsts, 99) if firsts.size else None,
            mean_tpot_s=float(np.mean(tpots)) if tpots.size else None,
            mean_e2e_s=float(np.mean(e2e)) if e2e.size else None,
            p99_e2e_s=percentile(e2e, 99) if e2e.size else None,
            mean_normalized_latency_s=float(np.mean(normalized)) if normalized.size else None,
            p99_normalized_latency_s=percentile(normalized, 99) if normalized.size else None,
            invariant_violations=self.invariant_violations,
            rejection_reasons=dict(sorted(self.rejection_reasons.items())),
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            prefix_cache_hit_pct=100.0 * self.prefix_cache_hits / self.prefix_cache_queries
            if self.prefix_cache_queries else 0.0,
            num_evictions=counters.num_evictions,
            num_copy_on_writes=counters.num_copy_on_writes,
            num_swaps=self.num_swaps,
            swap_out_bytes=self.swap_out_tokens * self.kv_bytes_per_token,
            swap_in_bytes=self.swap_in_tokens * self.kv_bytes_per_token,
            timeline=self.timeline if self.record_timeline else {},
            detail=ReplayDetail(
                running_time_s=self.running_time,
                # allocated - tokens; max() drops the -1e-14 that cancellation leaves when nothing is unused
                unused_slot_time_s=max(0.0, float(busy[USED] - busy[0])),
                allocated_slot_time_s=float(busy[USED]),
                busiest_seq_lens=self.busiest_seq_lens,
                peak_used_slots=self.peak_used_slots,
                num_block_allocations=counters.num_allocations,
                num_block_frees=counters.num_frees,
            ),
        )
