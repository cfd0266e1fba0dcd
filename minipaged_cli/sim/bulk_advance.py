"""Many decode-only steps of a replay at once, between events: the loop's fast path (``sim/replay.py``).

Stepping one decode step at a time costs Python work per token. Between events (an arrival, a completion, an
admission, a prefill, a block the pool cannot give, an extent that must grow) nothing but lengths changes, so
``BulkAdvance`` advances all those steps at once and integrates the metrics over them. ``replay(bulk=False)`` steps
one at a time: the reference this fast path is tested against (``tests/sim/test_replay*.py``). An arrival behind
a waiting head is no such event (FCFS queues it behind a head that stays held back): the advance queues it at its
step and goes on.

The clock moves by the same float additions the single steps make (``step_clock``: ``now + d1``, then ``+ d2``,
...), not by ``now + (d1 + d2 + ...)``: the two round differently, and on a clock of whole-millisecond steps a
step end and an arrival (a finish plus a think time) would tie on one path and not on the other
(0.013999999999999999 against 0.014), and the two paths would send and admit in a different order.

Over one full-attention pool (the paged strategy without windows, its step times a line in the context) a fresh
bulk reads its running requests once, compiled (``request_loops.decode_run``: the lengths, the clock, the steps to
the stop and to the free blocks' end, their allocation profile), and records its steps from that run; where that
pass does not build (``MINIPAGED_NATIVE=0``), and under windows, a calibration's decode table or a cut bulk that
resumes, the bulk takes its own path through NumPy (``_plan``, ``BulkPlan``): the run's reference, bit for bit
(``tests/sim/test_decode_run.py``).

A fleet's replica (``fleet/replica.py``) stops its bulk at every request the fleet routes, to any replica, where a
router reads the replicas; most go to other replicas, and nothing changed on this one. There the bulk resumes where
it stopped (``BulkPlan``): the step times, the clock and the allocation profile that the cut bulk computed are what
a fresh bulk from there computes.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from minipaged_cli.memory.allocators import Allocator, BulkProfile, total_slots
from minipaged_cli.sim.accounting import Accounting
from minipaged_cli.sim.bulk_plan import BulkPlan, ReplayState
from minipaged_cli.sim.categories import category_slots
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.request_loops import step_clock
from minipaged_cli.sim.scheduler import Scheduler
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.sim.step_work import checked_seconds

if TYPE_CHECKING:
    from minipaged_cli.sim.request_loops import BulkClock, DecodeRun

MAX_BULK_STEPS = 4096
MAX_BULK_CELLS = 1 << 16  # n requests * k steps in one bulk profile


class BulkAdvance:
    """Advances a replay's running requests by several decode-only steps at once and records them as the single
    steps would (``advance``); the replay then moves its clock and ends the steps (tiers, finished requests)."""

    def __init__(self, scheduler: Scheduler, allocator: Allocator, step_time: StepTimeModel,
                 accounting: Accounting) -> None:
        self.scheduler = scheduler
        self.allocator = allocator
        self.step_time = step_time
        self.accounting = accounting
        # Whether a bulk may run on through arrivals behind a head that memory or a batch limit holds back (the
        # replay turns it off where a pass between must see them: a fleet's replica, tiers, a layout, a step cap)
        self.through_arrivals = True
        # Whether a bulk cut short by an arrival resumes where it stopped when nothing changed since (a fleet's
        # replica turns it on: every request the fleet routes cuts its bulks, and most go to other replicas)
        self.resumes = False
        self._rest: BulkPlan | None = None  # what the last bulk left, where it was cut short

    def advance(self, now: float) -> float | None:
        """Run and record the decode-only steps from ``now`` up to the next event; the clock at the last one's end,
        or None (nothing changed) when the next step needs the single-step path."""
        scheduler = self.scheduler
        running = scheduler.running
        n = len(running)
        plan, self._rest = self._rest, None
        stop = None if plan is None else self._stop()  # (a pass with nothing to resume asks can_bulk first)
        # (a resumed plan needs no new test: nothing changed since the cut, where the bulk's premise held)
        if stop is None or not plan.resumes(self._state(now), stop[1], queued_behind=not scheduler.cache_aware_window):
            if not scheduler.can_bulk:
                return None  # (nothing running and a head that does not fit: the single step rejects it)
            if self.allocator.windowed and self.allocator.shared_slots:
                return None  # a shared block leaving a window changes the shared slots, which a bulk advance holds
            through, stop_s = stop = self._stop()
            if not self.resumes and (run := self._decode_run(now, stop_s)) is not None:
                return self._advance_run(run, through)
            lengths, allocated, finals, most_steps, total_length = decode_state(self.allocator, running,
                                                                                scheduler.passes)
            plan = self._plan(now, lengths, allocated, finals, most_steps, total_length)
        through, stop_s = stop or self._stop()
        total_length, allocated_sum, durations, clock = plan.total_length, plan.allocated_sum, plan.durations, \
            plan.clock
        num_steps = len(durations) if stop_s is None else plan.step_at(stop_s, len(durations))
        profile = plan.profile
        if profile is None:  # (a fresh plan, of the arrays above: only as far as this bulk goes)
            profile = self.allocator.bulk_profile(lengths, allocated, finals, num_steps)
        num_steps = min(num_steps, profile.num_steps)
        if num_steps == 0:
            return None
        parts, externals, num_steps = self._parts(through, num_steps, plan)

        # Saturation is decided per step, as the single step does after its growth: the queue's head is held
        # back in the steps whose new blocks eat its headroom. Without sliding windows free space only shrinks
        # here, so that is one run from the first held step on; windows free blocks too, so it comes and goes.
        external = externals[0]
        seconds = 0.0  # (the parts' times: an infinity anywhere shows in the sum)
        peak_used = None  # (where windows free blocks the peak may come before the last step; else the end's)
        if self.allocator.windowed:
            grown = profile.allocated - allocated_sum  # slots taken since the start: per step, or one number
            if scheduler.waiting:
                grown = np.broadcast_to(grown, num_steps)
                headroom = scheduler.admission_headroom()
                held_back = grown > headroom
                if headroom < 0 and not held_back.all():
                    num_steps = int(np.argmin(held_back))  # windows freed enough for the head: that step admits it
                    if num_steps == 0:
                        return None
                    held_back = held_back[:num_steps]
                changes = np.flatnonzero(held_back[1:] != held_back[:-1]) + 1 if held_back.any() else ()
                for start, stop in itertools.pairwise([0, *changes, num_steps]):
                    seconds += self._record(clock, profile, durations, total_length, n, external, start, stop,
                                            bool(held_back[start]))
            else:  # nothing waits: nothing is held back
                seconds += self._record(clock, profile, durations, total_length, n, external, 0, num_steps, False)
            peak_used = self.allocator.used_slots + (int(grown[:num_steps].max()) if isinstance(grown, np.ndarray)
                                                     else grown)
        else:
            num_free = num_steps
            if scheduler.waiting:
                per_step = profile.allocated  # (``np.broadcast_to`` costs more than the rest of this test)
                grown = (per_step[:num_steps] if isinstance(per_step, np.ndarray) else np.full(num_steps, per_step)) \
                    - allocated_sum
                num_free = int(grown.searchsorted(scheduler.admission_headroom(), side="right"))
            for start, stop, part in _spans(parts, num_free, num_steps):
                seconds += self._record(clock, profile, durations, total_length, n, externals[part], start, stop,
                                        start >= num_free, parts[part])
        end = self._end(num_steps, total_length, peak_used, seconds, float(clock[num_steps]))
        if plan.profile is not None and num_steps < len(durations):
            self._rest = plan.rest(num_steps, n, self._state(end))
        return end

    def _decode_run(self, now: float, stop_s: float | None) -> DecodeRun | None:
        """A fresh bulk over one full-attention pool in one compiled pass (``request_loops.decode_run``: the clock,
        the steps to the stop and to the free blocks' end, their profile), where it builds; else None."""
        running = self.scheduler.running
        pool = self.allocator.full_attention_pool(running)
        terms = None if pool is None else self.step_time.decode_step_terms(len(running))
        if terms is None:
            return None
        return self.scheduler.passes.decode_run(running, now, bulk_step_cap(len(running)), *terms, stop_s, *pool)

    def _advance_run(self, run: DecodeRun, through: bool) -> float | None:
        """``advance`` over a ``decode_run``: its steps, cut at the arrivals it runs through, recorded as ``_record``
        records the steps of a plan without windows."""
        checked_seconds(run.shortest)
        if run.num_steps == 0:
            return None
        scheduler, n = self.scheduler, len(self.scheduler.running)
        parts, externals, num_steps = self._parts(through, run.num_steps, run)
        num_free = num_steps
        if scheduler.waiting:  # (the head's headroom as ``can_bulk`` found it: since, arrivals joined the tail only)
            headroom = scheduler.head_headroom
            num_free = run.steps_within(scheduler.admission_headroom() if headroom is None else headroom, num_steps)
        capacity, shared, seconds = self.allocator.capacity_tokens, self.allocator.shared_slots, 0.0
        for start, stop, part in _spans(parts, num_free, num_steps):
            duration, slots = run.record(start, stop, parts[part], externals[part], capacity, shared)
            self.accounting.record(run.time_at(start), duration, slots, start >= num_free, stop - start, n)
            seconds += duration
        return self._end(num_steps, run.total_length, None, seconds, run.time_at(num_steps))

    def _parts(self, through: bool, num_steps: int, clock: BulkClock) -> tuple[list[int], list[int], int]:
        """The steps at whose start requests arrive (the parts of the bulk, where it runs through arrivals: each
        queued at its step), the external fragmentation from each on (the smallest waiting need may shrink), and
        the bulk's steps (it ends at an arrival the pass at that step would see)."""
        scheduler = self.scheduler
        parts, externals = [0], [scheduler.external_fragmentation()]
        while through and (arrival := scheduler.next_arrival_s) is not None:
            start = clock.step_at(arrival, num_steps)
            if start == num_steps:
                break
            if start == parts[-1]:  # (one the pass at that step did not queue: the next pass sees it)
                return parts, externals, start
            scheduler.arrive(clock.time_at(start))
            parts.append(start)
            externals.append(scheduler.external_fragmentation())
        return parts, externals, num_steps

    def _end(self, num_steps: int, total_length: int, peak_used: int | None, seconds: float, end: float) -> float:
        """A bulk's steps applied: the running requests grown, its busiest step noted; the clock at its end."""
        running = self.scheduler.running
        self.allocator.advance(running, num_steps)
        self.scheduler.passes.advance(running, num_steps)
        self.accounting.note_busiest(running, self.allocator.used_slots if peak_used is None else peak_used,
                                     total_length + len(running) * num_steps)
        checked_seconds(seconds)
        return end

    def _stop(self) -> tuple[bool, float | None]:
        """Whether the bulk runs on through arrivals, and the moment before which it stops otherwise (the next
        arrival; None: none).

        Behind a waiting head an arrival joins the queue's tail and changes no step (the head stays held back: free
        memory only shrinks without windows, the batch stays as it is); else the bulk stops before the step that
        starts at or after the next arrival, which may admit that request."""
        scheduler = self.scheduler
        through = self.through_arrivals and bool(scheduler.waiting) and not self.allocator.windowed \
            and not scheduler.cache_aware_window
        return through, None if through else scheduler.next_arrival_s

    def _plan(self, now: float, lengths: np.ndarray, allocated: np.ndarray | int, finals: np.ndarray,
              num_steps: int, total_length: int) -> BulkPlan:
        """A fresh bulk's inputs: each step's time and the clock at each step's end, for up to ``num_steps``
        steps; where a cut bulk may resume, the allocation profile of them all (else the bulk profiles only the
        steps it takes). ``total_length``: the lengths' sum."""
        n = len(lengths)
        # Tokens the queries of each step attend to, their own included: total_length + n * j for j = 1..k.
        terms = self.step_time.decode_step_terms(n)
        if terms is None:  # (no line in the context: the model's own arrays)
            contexts = np.arange(total_length + n, total_length + n * (num_steps + 1), n, dtype=np.int64)
            durations = self.step_time.step_seconds(new_tokens=n, sequences=n, decodes=n, decode_context=contexts)
            shortest, clock = float(np.minimum.reduce(durations)), step_clock(now, durations)
        else:  # (the same floats, compiled where the passes are: a bulk is a handful of steps)
            buffer, shortest = self.scheduler.passes.decode_clock(now, total_length + n, n, num_steps, *terms)
            numbers = np.frombuffer(buffer)  # (float64: k durations, then the k + 1 boundaries)
            durations, clock = numbers[:num_steps], numbers[num_steps:]
        checked_seconds(shortest)  # (a NaN anywhere makes the min NaN)
        profile = self.allocator.bulk_profile(lengths, allocated, finals, num_steps) \
            if self.resumes and not self.allocator.windowed else None
        return BulkPlan(total_length, total_slots(allocated), durations, clock, num_steps == bulk_step_cap(n),
                        profile, None)

    def _state(self, now: float) -> ReplayState:
        """What changes on the replay when anything but a bulk's own steps happens: the clock, the steps taken,
        the requests running, the slots in use, the queue's head and length."""
        scheduler = self.scheduler
        return (now, self.accounting.num_steps, len(scheduler.running), self.allocator.used_slots,
                scheduler.waiting[0] if scheduler.waiting else None, len(scheduler.waiting))

    def _record(self, clock: np.ndarray, profile: BulkProfile, durations: np.ndarray, total_length: int, n: int,
                external: int, start: int, stop: int, saturated: bool, first: int = 0) -> float:
        """Record steps ``start`` to ``stop`` of an advance whose steps start at ``clock``: time integrals of
        the category inputs; ``first``: the step that part of the advance starts at (its tokens are summed as from
        there, as an advance starting there sums them). Returns the steps' time.

        The shared slots stay constant: no admission, fork or release until the last step."""
        duration, weighted, allocated, internal, tokens = self.scheduler.passes.bulk_integrals(
            durations, start, stop, first, profile.allocated, profile.internal, profile.tokens)
        if tokens is None:  # (the lengths: total_length + n * (j - first + 1) during step j)
            tokens = (total_length + n * first) * duration + n * weighted
        slots = category_slots(
            tokens,
            allocated,
            internal,
            external * duration,
            self.allocator.capacity_tokens * duration,
            self.allocator.shared_slots * duration,
        )
        began = float(clock[start])
        self.accounting.record(began, duration, slots, saturated, stop - start, n)
        return duration


def _spans(parts: list[int], num_free: int, num_steps: int) -> Iterable[tuple[int, int, int]]:
    """The runs of a bulk's steps without windows that no arrival and no change of saturation splits, as a bulk
    starting at each arrival would record them: (start, stop, the part it is in)."""
    if len(parts) == 1 and num_steps > 0 and (num_free >= num_steps or num_free == 0):  # (most bulks: one run)
        return ((0, num_steps, 0),)
    return ((start, stop, bisect.bisect_right(parts, start) - 1)
            for start, stop in itertools.pairwise(sorted({*parts, num_free, num_steps})))


def decode_state(allocator: Allocator, running: list[LiveRequest],
                 passes: ModuleType) -> tuple[np.ndarray, np.ndarray | int, np.ndarray, int, int]:
    """The running requests' computed lengths, allocated slots (``Allocator.bulk_allocations``: each one's, or
    their sum) and final lengths: what ``Allocator.bulk_profile`` reads; the most decode steps one bulk may take
    (none past the first finish, and a bounded profile); and the lengths' sum (a NumPy reduction costs microseconds
    a call). ``passes``: ``request_loops`` or its compiled passes."""
    lengths, finals, fewest_left, total_length = passes.decode_lengths(running)
    return (np.frombuffer(lengths, dtype=np.int64), allocator.bulk_allocations(running),
            np.frombuffer(finals, dtype=np.int64), min(fewest_left, bulk_step_cap(len(running))), total_length)


def bulk_step_cap(num_running: int) -> int:
    """The most decode steps one bulk of ``num_running`` requests may take, finishes aside (a bounded profile)."""
    return min(MAX_BULK_STEPS, max(1, MAX_BULK_CELLS // num_running))

