"""Continuous-batching replay of a trace under one allocation strategy, and where the KV memory goes.

Each step: running requests in the decode phase each need room for one more token (if the pool cannot give
it, the latest admitted request is preempted and recomputed later); if nobody was preempted, waiting requests
are admitted first-come first-served while the strategy can place their prompt; admitted prompts are prefilled
(whole, or in chunks of a ``max_batched_tokens`` budget); every decoding request writes one token's KV and
samples the next; finished requests free their memory. A step lasts
``max(flops / peak_flops, bytes / hbm_bandwidth) + overhead`` on the GPU preset.

Memory categories during a step: ``sim.categories`` defines them (token states, reserved-future, internal and
external fragmentation, free; they sum to the capacity). A request's final length is prompt + output - 1: the
last sampled token is never fed back, so its KV is never written.

Shared blocks (``paged`` only): with ``prefix_caching`` a request's prompt finds its leading full blocks in the
prefix cache (those of shared segments, written by earlier requests, or its own, when it is recomputed) and
prefills only the rest; a request with ``n`` > 1 forks ``n - 1`` more
sequences after its prefill, holding the prompt's blocks with it until copy-on-write. A shared block holds its
tokens once, so the per-request sums above count ``allocator.shared_slots`` too many; that is taken off the
token states and the allocated slots. Preemption either recomputes the victim (drops its KV; it prefills
prompt + generated tokens again) or, with ``preemption="swap"``, moves its KV to a CPU pool of ``cpu_blocks``
blocks over the host link and back when it is readmitted (recompute when the CPU pool is full).

Stepping one decode step at a time costs Python work per token; between events (an arrival, a completion,
an admission, a prefill, a block the pool cannot give, an extent that must grow) nothing but lengths changes,
so ``replay`` advances all those steps at once and integrates the metrics over them (``bulk=False`` steps one
at a time, the reference the fast path is tested against).
"""

from __future__ import annotations

import bisect
import difflib
import functools
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minipaged_cli.errors import InputError
from minipaged_cli.memory.allocators import Allocator, Holding
from minipaged_cli.memory.paged import PagedAllocator
from minipaged_cli.memory.prefix import block_content_keys
from minipaged_cli.memory.strategies import STRATEGIES, make_allocator
from minipaged_cli.sim.categories import CATEGORIES, USED, category_slots
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, Trace

PREEMPTION_MODES = ("recompute", "swap")
_MAX_BULK_STEPS = 4096
_MAX_BULK_CELLS = 1 << 16  # n requests * k steps in one bulk profile
_STEPS = np.arange(1, _MAX_BULK_STEPS + 1, dtype=np.int64)


@dataclass(frozen=True)
class SimConfig:
    """One capacity for every strategy: ``num_blocks * block_size`` KV slots of ``model.kv_bytes_per_token``."""

    model: ModelSpec
    gpu: GpuSpec
    num_blocks: int
    block_size: int = 16
    max_model_len: int | None = None  # None: the model's
    max_num_seqs: int = 256
    max_batched_tokens: int | None = None  # None: whole prompts, no chunking
    prefix_caching: bool = False  # paged only
    preemption: str = "recompute"  # or "swap"
    cpu_blocks: int = 0  # swap space, in blocks of block_size tokens
    watermark: float = 0.0  # paged admission keeps this fraction of the blocks free
    check_invariants: bool = False
    record_timeline: bool = False

    def __post_init__(self) -> None:
        positive = {"--num-blocks": self.num_blocks, "--block-size": self.block_size,
                    "--max-num-seqs": self.max_num_seqs, "--max-model-len": self.max_model_len or 1,
                    "--max-batched-tokens": self.max_batched_tokens or 1}
        for option, value in positive.items():
            if value < 1:
                raise InputError("must be >= 1", field=option, value=value, has_value=True)
        if self.preemption not in PREEMPTION_MODES:
            raise InputError(f"expected one of {', '.join(PREEMPTION_MODES)}", field="--preemption",
                             value=self.preemption, has_value=True)
        if self.cpu_blocks < 0:
            raise InputError("must be >= 0", field="--cpu-blocks", value=self.cpu_blocks, has_value=True)
        if self.preemption == "swap" and self.cpu_blocks == 0:
            raise InputError("swap needs a CPU pool; set --cpu-blocks", field="--cpu-blocks", value=0,
                             has_value=True)
        if not 0.0 <= self.watermark < 1.0:
            raise InputError("must be in [0, 1)", field="--watermark", value=self.watermark, has_value=True)

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def model_len(self) -> int:
        return self.max_model_len or self.model.max_model_len

    @property
    def prefill_token_limit(self) -> int:
        """Prompt tokens one step may prefill: the chunked-prefill budget, else vLLM's unchunked default."""
        return self.max_batched_tokens or max(self.model_len, 2048)


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
    """What one strategy did with the trace. Percentages are of the KV capacity, 0-100."""

    token_state_pct: float
    reserved_future_pct: float
    internal_frag_pct: float
    external_frag_pct: float
    free_pct: float
    averaged_over: str  # "saturated" (steps with a request waiting for memory) or "busy" (all steps)
    kv_cache_usage_perc: float
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
    timeline: dict[str, list[float]] = field(default_factory=dict, repr=False)
    detail: ReplayDetail | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, float | int | str]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("timeline", "detail")}
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}


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
    """

    prefills: list[tuple[int, int, int]]
    decodes: list[tuple[int, int]]
    live_tokens: int
    copies: list[tuple[int, int]] = field(default_factory=list)
    forks: list[tuple[int, int]] = field(default_factory=list)


@dataclass(eq=False)  # identity: the engine looks requests up in its lists
class _Live(Holding):
    """A request inside the engine."""

    request: Request | None = None
    request_index: int = 0
    sample: int = 0  # 0 for the sequence that prefills; 1..n-1 for the ones forked from it
    num_computed: int = 0  # L: tokens whose KV is written
    num_generated: int = 0  # output tokens sampled so far
    prompt_length: int = 0  # tokens to prefill since the last admission: prompt + tokens generated before it
    first_token_s: float | None = None
    queried: bool = False  # its prompt was looked up in the prefix cache once (later lookups are re-prefills)
    forked: bool = False  # its other samples exist (forked after its prefill, or it is one of them)
    swapped_slots: int = 0  # slots of its KV in the CPU pool while swapped out

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.prompt_length


class _Integrator:
    """Step-duration-weighted sums of the memory categories over saturated steps and over all busy steps."""

    def __init__(self) -> None:
        self.weight = {"saturated": 0.0, "busy": 0.0}
        self.sums = {key: np.zeros(len(CATEGORIES) + 1) for key in self.weight}

    def add(self, duration: float, integrals: np.ndarray, saturated: bool) -> None:
        """``integrals``: Σ duration * slots over the steps, per category and (last) allocated slots."""
        for key in ("saturated", "busy") if saturated else ("busy",):
            self.weight[key] += duration
            self.sums[key] += integrals

    def averages(self, capacity: int) -> tuple[str, np.ndarray]:
        key = "saturated" if self.weight["saturated"] > 0 else "busy"
        if self.weight[key] == 0:  # nothing ever ran: all memory stayed free
            return key, category_slots(0, 0, 0, 0, 100.0)
        averages = 100.0 * self.sums[key] / self.weight[key] / capacity
        return key, np.where(np.abs(averages) < 1e-9, 0.0, averages)  # no "-0.0" from rounding


class _Replay:
    def __init__(self, trace: Trace, config: SimConfig, allocator: Allocator, bulk: bool,
                 progress: Callable[[int], None] | None,
                 on_step: Callable[[StepWork, Allocator], None] | None = None,
                 max_steps: int | None = None) -> None:
        self.config = config
        self.model = config.model
        self.allocator = allocator
        self.bulk = bulk
        self.progress = progress
        self.requests = trace.requests
        self.segments = trace.segments
        self.next_arrival = 0
        self.next_sequence_id = len(trace.requests)  # forked samples are numbered after the requests
        self.waiting: deque[_Live] = deque()
        self.waiting_needs: list[int] = []  # sorted admission needs of the waiting requests
        self.running: list[_Live] = []
        self.now = 0.0
        self.integrator = _Integrator()
        self.finished: list[tuple[_Live, float]] = []  # (sequence, finish time), every sample
        self.samples_left: dict[int, int] = {}  # request index -> its sequences not yet finished or rejected
        self.num_completed = 0
        self.rejected: set[int] = set()  # request indices
        self.rejection_reasons: dict[str, int] = {}
        self.num_preemptions = 0
        self.num_swaps = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.cpu_capacity = config.cpu_blocks * config.block_size  # swap space, slots
        self.cpu_used = 0
        self.swap_out_tokens = 0
        self.swap_in_tokens = 0
        self.step_swap_tokens = 0  # swapped since the last step was timed
        self.fork_copy_tokens = 0  # copied by contiguous forks since the last step was timed
        self.pending_forks: list[tuple[int, int]] = []  # for the next StepWork
        self.forked = False  # forks since the last single step: their shared last blocks need copy-on-write
        self.keyed = config.prefix_caching and isinstance(allocator, PagedAllocator)  # blocks get content keys
        self.num_steps = 0
        self.batch_size_sum = 0
        self.max_batch_size = 0
        self.invariant_violations = 0
        self.timeline: dict[str, list[float]] = {"time_s": [], **{c: [] for c in CATEGORIES}}
        self.on_step = on_step
        self.max_steps = max_steps
        self.running_time = 0.0
        self.peak_tokens = -1
        self.busiest_seq_lens: list[int] = []
        self.peak_used_slots = 0
        gpu = config.gpu
        self._seconds_per_token = 2.0 * self.model.num_params / gpu.peak_flops
        self._seconds_per_attended_token = self.model.attention_flops_per_context_token / gpu.peak_flops
        self._seconds_for_weights = self.model.weight_bytes / gpu.hbm_bandwidth_bytes_per_s
        self._seconds_per_kv_token = self.model.kv_bytes_per_token / gpu.hbm_bandwidth_bytes_per_s
        self._seconds_per_host_token = self.model.kv_bytes_per_token / gpu.host_bandwidth_bytes_per_s

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self) -> StrategyMetrics:
        while self.next_arrival < len(self.requests) or self.waiting or self.running:
            if self.max_steps is not None and self.num_steps >= self.max_steps:
                break
            self._arrive()
            if not self.running and not self.waiting:
                if self.next_arrival < len(self.requests):  # idle until the next arrival
                    self.now = max(self.now, self.requests[self.next_arrival].arrival_s)
                continue
            if not (self.bulk and self._bulk_step()):
                self._single_step()
            if self.config.check_invariants:
                self.invariant_violations += bool(self.allocator.invariant_violations())
            if self.progress is not None:
                self.progress(self.num_completed + len(self.rejected))
        return self._metrics()

    def _arrive(self) -> None:
        while self.next_arrival < len(self.requests) and self.requests[self.next_arrival].arrival_s <= self.now:
            request = self.requests[self.next_arrival]
            live = _Live(self.next_arrival, request.prompt_tokens, request.output_tokens, request=request,
                         request_index=self.next_arrival, prompt_length=request.prompt_tokens)
            if self.keyed:
                live.block_hashes = self._content_keys(request, self.next_arrival, sample=0)
            self.samples_left[self.next_arrival] = request.n
            self.next_arrival += 1
            if request.total_tokens > self.config.model_len:
                self._reject(live, "longer than --max-model-len")
            elif (reason := self.allocator.rejection_reason(live)) is not None:
                self._reject(live, reason)
            else:
                self._enqueue(live, front=False)

    def _head_admissible(self) -> bool:
        """Whether the first waiting request would be admitted now (ignoring this step's decode growth)."""
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return False
        if self.config.max_batched_tokens is not None and \
                sum(r.prefill_done for r in self.running) >= self.config.max_batched_tokens:
            return False
        head = self.waiting[0]
        return self.allocator.can_admit(head, head.prompt_length)

    def _waiting_for_memory(self) -> bool:
        """A step is saturated when the queue's head is held back by memory, not by a batch limit."""
        if not self.waiting:
            return False
        head = self.waiting[0]
        return not self.allocator.can_admit(head, head.prompt_length)

    def _single_step(self) -> None:
        decoders = [r for r in self.running if r.prefill_done]
        copied, self.fork_copy_tokens = self.fork_copy_tokens, 0
        preempted = False
        for live in decoders:
            while live in self.running:
                moved = self.allocator.try_grow(live, live.num_computed, live.num_computed + 1)
                if moved is not None:
                    copied += moved
                    break
                self._preempt(self.running[-1])
                preempted = True
        if preempted:
            decoders = [r for r in decoders if r in self.running]
        self.forked = False
        copies = self.allocator.take_copies()
        copied += len(copies) * self.config.block_size

        budget = self.config.prefill_token_limit - (len(decoders) if self.config.max_batched_tokens else 0)
        saturated = preempted or self._waiting_for_memory()
        if not preempted:
            self._admit(budget)
        if not self.running:
            if not preempted:
                # Nothing runs and the head still does not fit: it never will (only reachable when its
                # recompute prompt outgrew what the strategy can place); reject it so the replay ends.
                self._reject(self._dequeue(), "preempted, and its prompt plus generated tokens no longer fit")
            return  # a request that preempted itself is admitted again, into an empty pool, next step

        # Prefill: whole prompts (admitted this step), or chunks of the budget in admission order.
        chunks: list[tuple[_Live, int]] = []
        for live in self.running:
            if live.prefill_done:
                continue
            chunk = live.prompt_length - live.num_computed
            if self.config.max_batched_tokens is not None:
                chunk = min(chunk, budget)
                if chunk <= 0:
                    break
                budget -= chunk
                self.allocator.mark_computed(live, live.num_computed + chunk)  # its blocks may be cached now
            chunks.append((live, chunk))

        contexts = sum(r.num_computed + 1 for r in decoders)
        num_new = len(decoders) + sum(c for _, c in chunks)
        attended = contexts + sum(c * r.num_computed + c * (c + 1) / 2 for r, c in chunks)
        kv_moved = contexts + len(decoders) + sum(r.num_computed + c for r, c in chunks) + 2 * copied
        duration = float(self._step_time(num_new, attended, kv_moved))
        duration += self.step_swap_tokens * self._seconds_per_host_token
        self.step_swap_tokens = 0

        if self.on_step is not None:
            work = StepWork(prefills=[(r.sequence_id, r.num_computed, c) for r, c in chunks],
                            decodes=[(r.sequence_id, r.num_computed) for r in decoders],
                            live_tokens=sum(r.num_computed for r in self.running) + num_new
                            - self.allocator.shared_slots,
                            copies=copies, forks=self.pending_forks)
            self.on_step(work, self.allocator)
        self.pending_forks = []
        for live in decoders:
            live.num_computed += 1
            live.num_generated += 1
        for live, chunk in chunks:
            live.num_computed += chunk
            if live.prefill_done:
                live.num_generated += 1
                if live.first_token_s is None:
                    live.first_token_s = self.now + duration
        self._record(duration, duration * self._categories_now(), saturated, 1)
        self._note_busiest()
        self.now += duration
        for live, _ in chunks:
            if live.prefill_done and live.request.n > 1 and not live.forked:
                self._fork_samples(live)
        self._finish()

    def _bulk_step(self) -> bool:
        """Advance several decode-only steps at once; False when this step needs the single-step path."""
        # Without chunking every prompt is prefilled whole in the step that admits it.
        chunked = self.config.max_batched_tokens is not None
        if not self.running or (chunked and any(not r.prefill_done for r in self.running)) or self.forked \
                or self.step_swap_tokens or self._head_admissible():
            return False  # (nothing running and a head that does not fit: the single step rejects it)
        running = self.running
        n = len(running)
        lengths = np.fromiter((r.num_computed for r in running), dtype=np.int64, count=n)
        num_steps = min(min(r.output_tokens - r.num_generated for r in running), _MAX_BULK_STEPS,
                        max(1, _MAX_BULK_CELLS // n))
        steps = _STEPS[:num_steps]
        total_length = int(lengths.sum())
        contexts = total_length + n * steps  # tokens the queries of each step attend to (their own included)
        durations = self._step_time(n, contexts, contexts + n)
        if self.next_arrival < len(self.requests):
            # Stop before the step that starts at or after the next arrival: it may admit that request.
            ends = self.now + np.cumsum(durations)
            num_steps = 1 + int(np.searchsorted(ends[:-1], self.requests[self.next_arrival].arrival_s, side="left"))
        allocated = np.fromiter((self.allocator.allocated(r) for r in running), dtype=np.int64, count=n)
        finals = np.fromiter((r.final_length for r in running), dtype=np.int64, count=n)
        profile = self.allocator.bulk_profile(lengths, allocated, finals, num_steps)
        num_steps = profile.num_steps
        if num_steps == 0:
            return False

        durations = durations[:num_steps]
        duration = float(durations.sum())
        # Time integrals of the category inputs (the shared slots stay constant: no admission, fork or release
        # until the last step).
        self._record(duration, category_slots(
            total_length * duration + n * float(durations @ steps[:num_steps]),
            _integral(profile.allocated, durations, duration),
            _integral(profile.internal, durations, duration),
            self._external_fragmentation() * duration,
            self.allocator.capacity_tokens * duration,
            self.allocator.shared_slots * duration,
        ), self._waiting_for_memory(), num_steps)

        self.allocator.advance(running, num_steps)
        for live in running:
            live.num_computed += num_steps
            live.num_generated += num_steps
        self._note_busiest(total_length + n * num_steps)
        self.now += duration
        self._finish()
        return True

    # -- admission, preemption, completion -----------------------------------------------------------------

    def _admit(self, budget: int) -> None:
        admitted_tokens = 0
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            head = self.waiting[0]
            if not self.allocator.can_admit(head, head.prompt_length):
                return
            if self.config.max_batched_tokens is not None:
                if budget - admitted_tokens <= 0:
                    return
            elif admitted_tokens and admitted_tokens + head.prompt_length > budget:
                return
            # Unchunked, the admitting step computes the whole prompt; chunked, only what swaps back in, and each
            # chunk is reported as it is scheduled.
            computed = None if self.config.max_batched_tokens is None else \
                head.num_computed if head.swapped_slots else 0
            cached = self.allocator.admit(head, head.prompt_length, computed)
            self.running.append(self._dequeue())
            if head.swapped_slots:  # swap in: its KV comes back, except blocks the prefix cache still holds
                moved = max(head.swapped_slots - cached, 0)
                self.cpu_used -= head.swapped_slots
                head.swapped_slots = 0
                self.swap_in_tokens += moved
                self.step_swap_tokens += moved
            else:
                head.num_computed = cached
                if self.keyed and not head.queried:  # a re-prefill is not a query (vLLM PR 25787)
                    head.queried = True
                    self.prefix_cache_queries += head.prompt_length
                    self.prefix_cache_hits += cached
            admitted_tokens += head.prompt_length - head.num_computed

    def _enqueue(self, live: _Live, *, front: bool) -> None:
        if front:
            self.waiting.appendleft(live)
        else:
            self.waiting.append(live)
        if self.allocator.has_external_fragmentation:
            bisect.insort(self.waiting_needs, self.allocator.admission_need(live, live.prompt_length))

    def _dequeue(self) -> _Live:
        live = self.waiting.popleft()
        if self.allocator.has_external_fragmentation:
            del self.waiting_needs[bisect.bisect_left(self.waiting_needs,
                                                      self.allocator.admission_need(live, live.prompt_length))]
        return live

    def _preempt(self, victim: _Live) -> None:
        """Swap the victim's KV out to the CPU pool if it has room (it comes back on readmission), else
        recompute: drop it, and prefill prompt + generated tokens again when readmitted."""
        slots = self.allocator.swap_slots(victim, victim.num_computed)
        self.allocator.release(victim)
        self.running.remove(victim)
        self.num_preemptions += 1
        if self.config.preemption == "swap" and self.cpu_used + slots <= self.cpu_capacity:
            self.cpu_used += slots
            victim.swapped_slots = slots
            self.num_swaps += 1
            self.swap_out_tokens += slots
            self.step_swap_tokens += slots
            # readmission allocates for what it holds, and a victim caught mid-prefill resumes it
            victim.prompt_length = max(victim.prompt_length, victim.num_computed)
        else:
            victim.num_computed = 0
            victim.prompt_length = victim.prompt_tokens + victim.num_generated
        self._enqueue(victim, front=True)

    def _fork_samples(self, leader: _Live) -> None:
        """Parallel sampling: the other n - 1 sequences, each with its own first token, from the leader's prompt.
        A sample that cannot be forked (no room for a contiguous copy, or the batch is full) waits to prefill."""
        leader.forked = True
        for sample in range(1, leader.request.n):
            keys = self._content_keys(leader.request, leader.request_index, sample) if self.keyed else []
            child = _Live(self.next_sequence_id, leader.prompt_tokens, leader.output_tokens, keys,
                          request=leader.request, request_index=leader.request_index, sample=sample,
                          num_computed=leader.num_computed, num_generated=leader.num_generated,
                          prompt_length=leader.prompt_length, first_token_s=leader.first_token_s, queried=True,
                          forked=True)
            self.next_sequence_id += 1
            if child.num_generated >= child.output_tokens:  # its only token came with the prefill
                self._sample_done(child)
                continue
            copied = None
            if len(self.running) < self.config.max_num_seqs:
                copied = self.allocator.fork(leader, child, leader.num_computed)
            if copied is None:
                child.num_computed = 0
                child.prompt_length = child.prompt_tokens + child.num_generated
                self._enqueue(child, front=True)
                continue
            self.running.append(child)
            self.fork_copy_tokens += copied
            self.pending_forks.append((leader.sequence_id, child.sequence_id))
            self.forked = True

    def _content_keys(self, request: Request, request_index: int, sample: int) -> list[Hashable]:
        """Keys of a sequence's full blocks: its shared segments, then its own prompt tokens, then the output of
        this sample. Only the segments can match another request's; the rest lets a recomputed sequence find its
        own blocks while they are still cached."""
        runs: list[tuple[Hashable, int]] = [(name, self.segments[name]) for name in request.prefix]
        own_prompt = request.prompt_tokens - sum(length for _, length in runs)
        runs += [(("prompt", request_index), own_prompt), (("output", request_index, sample), request.output_tokens)]
        return block_content_keys(runs, self.config.block_size)

    def _finish(self) -> None:
        done = [r for r in self.running if r.num_generated >= r.output_tokens]
        for live in done:
            self.allocator.release(live)
            self.running.remove(live)
            self._sample_done(live)

    def _sample_done(self, live: _Live) -> None:
        self.finished.append((live, self.now))
        live.block_hashes = []  # the keys can be many; a finished sequence needs them no more
        self._count_done(live)

    def _reject(self, live: _Live, reason: str) -> None:
        if live.request_index not in self.rejected:
            self.rejected.add(live.request_index)
            self.rejection_reasons[reason] = self.rejection_reasons.get(reason, 0) + 1
        self.cpu_used -= live.swapped_slots
        live.swapped_slots = 0
        self._count_done(live)

    def _count_done(self, live: _Live) -> None:
        self.samples_left[live.request_index] -= 1
        if not self.samples_left[live.request_index] and live.request_index not in self.rejected:
            self.num_completed += 1

    # -- measurement ---------------------------------------------------------------------------------------

    def _note_busiest(self, live_tokens: int | None = None) -> None:
        """Keep the decoding lengths of the step with the most live tokens (the end of a bulk advance)."""
        self.peak_used_slots = max(self.peak_used_slots, self.allocator.used_slots)
        if live_tokens is None:
            live_tokens = sum(r.num_computed for r in self.running)
        if live_tokens > self.peak_tokens:
            self.peak_tokens = live_tokens
            self.busiest_seq_lens = [r.num_computed for r in self.running if r.prefill_done]

    def _step_time(self, num_new_tokens: int, attended: Any, kv_tokens_moved: Any) -> Any:
        """Roofline duration of steps processing ``num_new_tokens`` tokens that attend to ``attended`` cached
        tokens in all and read or write ``kv_tokens_moved`` tokens of KV (floats or arrays of them)."""
        compute = num_new_tokens * self._seconds_per_token + attended * self._seconds_per_attended_token
        memory = self._seconds_for_weights + kv_tokens_moved * self._seconds_per_kv_token
        return np.maximum(compute, memory) + self.config.gpu.step_overhead_s

    def _external_fragmentation(self) -> int:
        if not self.waiting_needs:
            return 0
        return self.allocator.external_fragmentation(self.waiting_needs[0])

    def _categories_now(self) -> np.ndarray:
        allocated = [self.allocator.allocated(r) for r in self.running]
        internal = sum(max(a - r.final_length, 0) for a, r in zip(allocated, self.running, strict=True))
        return category_slots(sum(r.num_computed for r in self.running), sum(allocated), internal,
                              self._external_fragmentation(), self.allocator.capacity_tokens,
                              self.allocator.shared_slots)

    def _record(self, duration: float, integrals: np.ndarray, saturated: bool, num_steps: int) -> None:
        self.integrator.add(duration, integrals, saturated)
        self.running_time += duration * len(self.running)
        self.num_steps += num_steps
        self.batch_size_sum += num_steps * len(self.running)
        self.max_batch_size = max(self.max_batch_size, len(self.running))
        if self.config.record_timeline:
            self.timeline["time_s"].append(self.now)
            for name, value in zip(CATEGORIES, integrals, strict=False):
                self.timeline[name].append(100.0 * value / duration / self.allocator.capacity_tokens)

    def _metrics(self) -> StrategyMetrics:
        manager = self.allocator.manager if isinstance(self.allocator, PagedAllocator) else None
        capacity = self.allocator.capacity_tokens
        averaged_over, averages = self.integrator.averages(capacity)
        busy = self.integrator.sums["busy"]
        finished = [r for r, _ in self.finished]
        finish_times = [t for _, t in self.finished]
        firsts = [r.first_token_s - r.request.arrival_s for r in finished if r.sample == 0]
        tpots = [(t - r.first_token_s) / (r.output_tokens - 1) for r, t in self.finished if r.output_tokens > 1]
        first_arrival = self.requests[0].arrival_s
        makespan = max(finish_times) - first_arrival if finish_times else 0.0
        output_tokens = sum(r.output_tokens for r in finished)
        kv_bytes = self.model.kv_bytes_per_token
        return StrategyMetrics(
            token_state_pct=float(averages[0]),
            reserved_future_pct=float(averages[1]),
            internal_frag_pct=float(averages[2]),
            external_frag_pct=float(averages[3]),
            free_pct=float(averages[4]),
            averaged_over=averaged_over,
            kv_cache_usage_perc=float(averages[USED]),
            completed_requests=self.num_completed,
            rejected_requests=len(self.rejected),
            num_preemptions=self.num_preemptions,
            mean_batch_size=self.batch_size_sum / self.num_steps if self.num_steps else 0.0,
            max_batch_size=self.max_batch_size,
            throughput_tokens_per_s=output_tokens / makespan if makespan > 0 else 0.0,
            makespan_s=makespan,
            mean_ttft_s=float(np.mean(firsts)) if firsts else None,
            p99_ttft_s=float(np.percentile(firsts, 99)) if firsts else None,
            mean_tpot_s=float(np.mean(tpots)) if tpots else None,
            invariant_violations=self.invariant_violations,
            rejection_reasons=dict(sorted(self.rejection_reasons.items())),
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            prefix_cache_hit_pct=100.0 * self.prefix_cache_hits / self.prefix_cache_queries
            if self.prefix_cache_queries else 0.0,
            num_evictions=manager.num_evictions if manager is not None else 0,
            num_copy_on_writes=manager.num_copy_on_writes if manager is not None else 0,
            num_swaps=self.num_swaps,
            swap_out_bytes=self.swap_out_tokens * kv_bytes,
            swap_in_bytes=self.swap_in_tokens * kv_bytes,
            timeline=self.timeline if self.config.record_timeline else {},
            detail=ReplayDetail(
                running_time_s=self.running_time,
                # allocated - tokens; max() drops the -1e-14 that cancellation leaves when nothing is unused
                unused_slot_time_s=max(0.0, float(busy[USED] - busy[0])),
                allocated_slot_time_s=float(busy[USED]),
                busiest_seq_lens=self.busiest_seq_lens,
                peak_used_slots=self.peak_used_slots,
                num_block_allocations=manager.num_allocations if manager is not None else 0,
                num_block_frees=manager.num_frees if manager is not None else 0,
            ),
        )


def _integral(values: np.ndarray | int, durations: np.ndarray, duration: float) -> float:
    """Σ durations * values, where values is per step or one constant."""
    return float(values @ durations) if isinstance(values, np.ndarray) else values * duration


def check_capacity(trace: Trace, config: SimConfig, strategies: tuple[str, ...]) -> None:
    """Bad input, before any replay: no request fits max_model_len, or a strategy can place none of them."""
    fitting = [r for r in trace.requests if r.total_tokens <= config.model_len]
    if not fitting:
        shortest = min(r.total_tokens for r in trace.requests)
        raise InputError(f"every request is longer (the shortest holds {shortest} tokens); raise it",
                         field="--max-model-len", value=config.model_len, has_value=True)
    for name in strategies:
        allocator = _allocator(name, config)
        holdings = [Holding(0, r.prompt_tokens, r.output_tokens) for r in fitting]
        if all(allocator.rejection_reason(h) is not None for h in holdings):
            smallest = min(allocator.largest_need(h) for h in holdings)
            hint = " or lower --max-model-len" if name == "max-reserve" else ""
            watermark = f" above the {config.watermark:g} watermark" if config.watermark and name == "paged" else ""
            raise InputError(f"the KV capacity of {allocator.capacity_tokens} tokens{watermark} is too small for any "
                             f"request under {name} (the smallest needs {smallest}); raise --kv-memory or "
                             f"--num-blocks{hint}", field="--kv-memory")


@dataclass
class SimulationResult:
    """Every strategy's metrics on one trace and one capacity; ``to_dict`` is the ``--json`` document."""

    trace: Trace
    config: SimConfig
    strategies: dict[str, StrategyMetrics]

    def to_dict(self) -> dict[str, Any]:
        config = self.config
        return {
            "trace": {"name": self.trace.name, "num_requests": self.trace.num_requests,
                      "prompt_tokens": self.trace.prompt_tokens, "output_tokens": self.trace.output_tokens},
            "config": {"model": config.model.name, "gpu": config.gpu.name, "block_size": config.block_size,
                       "num_blocks": config.num_blocks, "kv_capacity_tokens": config.kv_capacity_tokens,
                       "kv_bytes_per_token": config.model.kv_bytes_per_token, "max_model_len": config.model_len,
                       "prefix_caching": config.prefix_caching, "preemption": config.preemption,
                       "cpu_blocks": config.cpu_blocks, "watermark": config.watermark},
            "strategies": {name: metrics.to_dict() for name, metrics in self.strategies.items()},
        }


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
    return SimulationResult(trace, config, results)


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
    allocator = _allocator(strategy, config)
    return _Replay(trace, config, allocator, bulk and on_step is None, progress, on_step, max_steps).run()


def _check_strategy(name: str) -> None:
    if name not in STRATEGIES:
        close = difflib.get_close_matches(name, STRATEGIES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError(f"unknown strategy{hint}; expected some of {', '.join(STRATEGIES)}", field="--strategies",
                         value=name, has_value=True)


def _allocator(name: str, config: SimConfig) -> Allocator:
    return make_allocator(name, num_blocks=config.num_blocks, block_size=config.block_size,
                          max_model_len=config.model_len, prefix_caching=config.prefix_caching,
                          watermark_blocks=config.watermark_blocks)


def num_blocks_for_memory(kv_memory_bytes: int, model: ModelSpec, block_size: int) -> int:
    """Blocks of ``block_size`` tokens that fit in ``kv_memory_bytes`` of KV for ``model``."""
    return math.floor(kv_memory_bytes / (block_size * model.kv_bytes_per_token))
