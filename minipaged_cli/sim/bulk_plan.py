"""A bulk advance's plan (``sim/bulk_advance.py``): the running requests' total length and slots, each step's time,
the clock at each step boundary and, where a cut bulk may resume, the allocation profile of its steps; and what a
bulk cut short leaves of it (``BulkPlan.rest``), which resumes while nothing else changes on the replay
(``ReplayState``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minipaged_cli.memory.allocators import BulkProfile
from minipaged_cli.sim.live_request import LiveRequest

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

    def step_at(self, t: float, stop: int) -> int:
        """The first of steps 1 to ``stop`` that starts at or after ``t`` (``stop`` where none before it does)."""
        return 1 + int(self.clock[1:stop].searchsorted(t, side="left"))

    def time_at(self, step: int) -> float:
        """The clock at step ``step``'s start."""
        return float(self.clock[step])

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
