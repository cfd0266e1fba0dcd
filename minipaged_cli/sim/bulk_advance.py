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

A fleet's replica (``fleet/replica.py``) stops its bulk at every request the fleet routes, to any replica, where a
router reads the replicas; most go to other replicas, and nothing changed on this one. There the bulk resumes where
it stopped (``BulkPlan``): the step times, the clock and the allocation profile that the cut bulk computed are what
a fresh bulk from there computes.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from minipaged_cli.memory.allocators import Allocator, BulkProfile, total_slots
from minipaged_cli.sim.accounting import Accounting
from minipaged_cli.sim.categories import category_slots
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.request_loops import step_clock
from minipaged_cli.sim.scheduler import Scheduler
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.sim.step_work import checked_seconds

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
            lengths, allocated, finals, most_steps, total_length = decode_state(self.allocator, running,
                                                                                scheduler.passes)
            plan = self._plan(now, lengths, allocated, finals, most_steps, total_length)
        through, stop_s = stop or self._stop()
        total_length, allocated_sum, durations, clock = plan.total_length, plan.allocated_sum, plan.durations, \
            plan.clock
        num_steps = len(durations)
        if stop_s is not None:
            num_steps = 1 + int(clock[1:-1].searchsorted(stop_s, side="left"))
        profile = plan.profile
        if profile is None:  # (a fresh plan, of the arrays above: only as far as this bulk goes)
            profile = self.allocator.bulk_profile(lengths, allocated, finals, num_steps)
        num_steps = min(num_steps, profile.num_steps)
        if num_steps == 0:
            return None
        # The steps at whose start requests arrive (the parts of the bulk), and the external fragmentation from each
        # on (the smallest waiting need may shrink)
        parts, externals = [0], [scheduler.external_fragmentation()]
        if through:
            while (arrival := scheduler.next_arrival_s) is not None:
                start = 1 + int(clock[1:num_steps].searchsorted(arrival, side="left"))
                if start == num_steps:
                    break
                if start == parts[-1]:  # (one the pass at that step did not queue: the next pass sees it)
                    num_steps = start
                    break
                scheduler.arrive(float(clock[start]))
                parts.append(start)
                externals.append(scheduler.external_fragmentation())

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
            # One record a run of steps that no arrival and no change of saturation splits, as a bulk starting
            # at each arrival would record them
            for start, stop in itertools.pairwise(sorted({*parts, num_free, num_steps})):
                part = bisect.bisect_right(parts, start) - 1
                seconds += self._record(clock, profile, durations, total_length, n, externals[part], start, stop,
                                        start >= num_free, parts[part])
        self.allocator.advance(running, num_steps)
        scheduler.passes.advance(running, num_steps)
        self.accounting.note_busiest(running, self.allocator.used_slots if peak_used is None else peak_used,
                                     total_length + n * num_steps)
        checked_seconds(seconds)
        end = float(clock[num_steps])
        if plan.profile is not None and num_steps < len(durations):
            self._rest = plan.rest(num_steps, n, self._state(end))
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


# The clock, the steps taken, the requests running, the slots in use, the queue's head and length
ReplayState = tuple[float, int, int, int, LiveRequest | None, int]


@dataclass(slots=True)  # (not frozen: a frozen dataclass's ``__init__`` costs a call a field; none is changed)
class BulkPlan:
    """A bulk's inputs from its first step on: the running requests' total length and allocated slots, each step's
    time and the clock at each step boundary ([k] durations, [k + 1] times), and, where a cut bulk may resume, the
    allocation profile of those steps. What a bulk cut short leaves (``BulkAdvance._rest``, ``rest``) is the same
    plan from the cut on, as a bulk starting there computes it, for as long as the replay stays in ``state``: the
    same contexts, so the same times; the clock by the same additions; the profile's later steps, which a profile
    from the cut repeats (without sliding windows the pool's free blocks change by the bulk's own growth only, so
    the steps it can grow end where they did: ``tests/fleet/test_fleet_fast_paths.py``).

    ``capped``: the plan may stop short of the first finish (at the bound on a bulk's size): a fresh one from a later
    step may run longer."""

    total_length: int
    allocated_sum: int
    durations: np.ndarray  # [k] float64
    clock: np.ndarray  # [k + 1] float64
    capped: bool
    profile: BulkProfile | None
    state: ReplayState | None

    def rest(self, num_steps: int, num_running: int, state: ReplayState) -> BulkPlan:
        """The plan after its first ``num_steps`` steps, left in ``state``."""
        profile = self.profile
        assert profile is not None and 0 < num_steps <= profile.num_steps, "only a bulk's own steps are cut"
        allocated = int(profile.allocated[num_steps - 1]) if isinstance(profile.allocated, np.ndarray) \
            else profile.allocated
        later = BulkProfile(profile.num_steps - num_steps, _later(profile.allocated, num_steps),
                            _later(profile.internal, num_steps),
                            None if profile.tokens is None else profile.tokens[num_steps:])
        return BulkPlan(self.total_length + num_running * num_steps, allocated, self.durations[num_steps:],
                        self.clock[num_steps:], self.capped, later, state)

    def resumes(self, state: ReplayState, stop_s: float | None, *, queued_behind: bool) -> bool:
        """Whether a bulk from ``state``, stopping before the step that starts at or after ``stop_s`` (None: none),
        takes the steps of this plan: nothing changed since it was cut but, where ``queued_behind`` (FCFS),
        requests queued behind the same waiting head (which stays held back: the bulk's premise, as for a bulk
        through arrivals), and the plan covers those steps."""
        if self.state is None or state[:5] != self.state[:5]:
            return False
        if state[5] != self.state[5] and not queued_behind:  # (behind the same head: ``state[4]``)
            return False
        if not self.capped:
            return True
        num_steps = len(self.durations)  # (a fresh plan may run longer: the stop must come before this one's end)
        return stop_s is not None and int(self.clock[1:num_steps].searchsorted(stop_s, side="left")) < num_steps - 1


def _later(values: np.ndarray | int, num_steps: int) -> np.ndarray | int:
    """A ``BulkProfile`` series after its first ``num_steps`` steps (per step, or one constant)."""
    return values[num_steps:] if isinstance(values, np.ndarray) else values


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

