"""One replica of a fleet: today's engine (scheduler, block manager, step-time model, tiers) as an object that is
handed requests and advanced by the fleet's clock.

The replica wraps ``sim.replay.Replay`` and runs its loop one pass at a time (``Replay.iterate``): no second
scheduler. Its requests are a list the router appends to (``RoutedArrivals``, the scheduler's arrivals); their
``horizon_s`` (the fleet's next event) keeps a bulk advance from running past a moment when a request may reach
it, so one replica driven by the fleet takes exactly the steps ``simulate`` takes. A replica sent every request
before its replay starts (``sent_all``: a routing that reads nothing the replays change) runs as ``simulate``'s.

What a router may read (SPEC section 9) is what vLLM publishes at the end of a step: ``state_at(t)`` is the replica
as of its last step ended by ``t`` (a step that started before ``t`` and ends after it is not yet seen), and its KV
events (``events``, ``kv_events.py``) are published as of then. A bulk advance publishes at its end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from minipaged_cli.fleet.kv_events import KvEvents
from minipaged_cli.sim.accounting import StrategyMetrics
from minipaged_cli.sim.bulk_advance import decode_state
from minipaged_cli.sim.clients import OPEN_LOOP
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.replay import Replay
from minipaged_cli.workloads.trace import Request, Trace


@dataclass(frozen=True)
class ReplicaState:
    """A replica's scheduler stats at a step's end (vLLM's ``SchedulerStats``): ``kv_usage`` is the fraction of
    blocks requests hold (a cached block nobody holds is free, as vLLM counts it); ``num_arrived`` the requests of
    its own it had queued by then."""

    num_waiting: int
    num_running: int
    kv_usage: float
    num_arrived: int


class RoutedArrivals:
    """The requests a router sent to one replica, as its scheduler's arrivals (``sim.clients.Arrivals``' four
    members): each at the time it reached the replica, in the order sent. The next arrival is never later than
    ``horizon_s``, the fleet's next event, when the router may send one more. ``done`` collects what the
    scheduler reports finished (local index, time, completed, cached tokens) for the fleet's clients, which
    hear it on the fleet's clock (``fleet.py``)."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.num_sent = 0  # of ``requests``, those handed to the scheduler
        self.horizon_s: float | None = None
        self.done: list[tuple[int, float, bool, int]] = []

    @property
    def has_pending(self) -> bool:
        return self.num_sent < len(self.requests)

    @property
    def own_next_s(self) -> float | None:
        """The next request the router sent that the scheduler has not yet been handed."""
        return self.requests[self.num_sent].arrival_s if self.has_pending else None

    @property
    def next_arrival_s(self) -> float | None:
        own = self.own_next_s
        if self.horizon_s is None or (own is not None and own <= self.horizon_s):
            return own
        return self.horizon_s

    def due(self, now: float) -> Iterator[tuple[int, Request]]:
        while self.has_pending and self.requests[self.num_sent].arrival_s <= now:
            self.num_sent += 1
            yield self.num_sent - 1, self.requests[self.num_sent - 1]

    def finished(self, index: int, now: float, *, completed: bool, cached_tokens: int) -> None:
        self.done.append((index, now, completed, cached_tokens))


class Replica:
    """One engine of a fleet (the module docstring). ``role``: ``mixed`` (prefill and decode), ``prefill`` or
    ``decode`` (P/D disaggregation, ``fleet/disaggregation.py``)."""

    def __init__(self, index: int, config: SimConfig, segments: dict[str, int], num_fleet_requests: int, *,
                 role: str = "mixed", kv_events: bool = False, record_timeline: bool = False,
                 read_by_router: bool = True, shared_segments: set[str] | None = None) -> None:
        self.index = index
        # The fleet's clients send (``fleet.py``); the replica takes what it is sent when it is sent
        self.config = config = replace(config, clients=OPEN_LOOP) if config.clients.kind != "open" else config
        self.role = role
        self.arrivals = RoutedArrivals()
        self.requests = self.arrivals.requests  # what the router sent, in the order sent
        self.fleet_indices: list[int] = []  # each one's index in the fleet's trace
        trace = Trace(f"replica-{index}", (), segments)
        self.replay = Replay(trace, config, config.allocator("paged"), True, None)
        scheduler = self.replay.scheduler
        scheduler.arrivals = self.arrivals
        # (its next arrival may be the fleet's next event, not a request: each one ends a bulk, and the fleet's
        # loop runs between; ``sent_all`` gives the replay its own choice back)
        self.through_arrivals = self.replay.bulk_advance.through_arrivals
        self.replay.bulk_advance.through_arrivals = False
        # (where nothing but its steps changes a replica between passes, as where its bulks may run through
        # arrivals: no tiers, layout or step cap, a bulk that another replica's request cut goes on where it stopped)
        self.replay.bulk_advance.resumes = self.through_arrivals
        scheduler.fleet_indices = self.fleet_indices
        scheduler.next_sequence_id = num_fleet_requests  # (forked samples numbered after every request)
        self.events: KvEvents | None = None
        # Under the hybrid manager a prefix is matched in the first full-attention group: its KV events index it
        self.match_group = next((g for g, group in enumerate(config.kv_cache_groups) if not group.is_sliding), 0)
        if kv_events and scheduler.keyed:
            pool = self.replay.allocator.manager.pool  # type: ignore[attr-defined] - keyed: the paged allocator
            self.events = KvEvents.subscribed_to(pool, self.match_group)
        if scheduler.shared_segments is not None:  # (no index of the router is told its keys)
            scheduler.shared_segments = shared_segments if self.events is None else None
        self._state = self._before = self._read_state()
        # (its state after each pass, which only a router that reads replicas and the timeline read)
        self.keeps_state = read_by_router or record_timeline
        self._finished: list[tuple[LiveRequest, float]] = []  # since the last ``take_finished``
        scheduler.on_sample_done = self._sample_done  # (its latencies: its replay's accounting keeps them)
        # A lower bound on any step's time (``next_done_s``), less a relative 1e-6 for the float rounding of the
        # real steps' sums and of the clock's additions
        step_time = self.replay.step_time
        self.min_step_s = (step_time.overhead_s + step_time.lm_head_weights + step_time.lm_head_per_sequence) \
            * (1 - 1e-6)
        self._done_bound: tuple[tuple[float, int, int, int, int, int], float] | None = None  # (state it was for, bound)
        # (time, requests waiting or running, KV usage %) after each pass, for the fleet's plot
        self.timeline: list[tuple[float, int, float]] | None = [] if record_timeline else None

    @property
    def now(self) -> float:
        """The end of the replica's last step (or where it idles)."""
        return self.replay.now

    @property
    def has_work(self) -> bool:
        return self.replay.scheduler.has_work

    @property
    def ready_s(self) -> float:
        """When its next pass does something: now, or while it idles, when its next request reaches it."""
        scheduler = self.replay.scheduler
        own = self.arrivals.own_next_s
        if scheduler.running or scheduler.waiting or own is None:
            return self.now
        return max(self.now, own)

    @property
    def next_done_s(self) -> float:
        """A lower bound on when the replica's next finish or refusal comes (what may make a client send),
        until it is sent another request.

        While anything waits or is on its way to it, or its next steps are not decode-only (``Scheduler.can_bulk``:
        a prefill, a load, a fork), its next pass (``ready_s``): a refusal comes at a pass's start, a request of
        one output token finishes in its first step. Else the first finish needs the running sequence closest to
        its end to generate its last tokens, one a step at most, each step no shorter than ``min_step_s``: every
        step runs at least one sequence and pays the step's overhead, the LM head's weights and that sequence's
        logits; its other terms (tokens, attention, cache writes, copies, a tier's transfer) are sums of
        non-negative times (a calibration's are positive), so they only add
        (``sim.step_time.StepTimeModel.step_seconds``, ``sim.replay.Replay._duration``). A refusal needs a
        preemption first: a running request that cannot grow preempts the last running ones, itself included,
        and once none runs a head that no longer fits is refused in a pass at the same moment. So the bound also
        stops at the first step whose growth the pool might not give: the steps the bulk advance's own profile
        (``Allocator.bulk_profile``, tested against single steps) grows without fail come first.

        vLLM: vllm/v1/core/sched/scheduler.py::Scheduler.schedule
        """
        scheduler = self.replay.scheduler
        # (what a pass changes: its clock, its steps, what it was sent and queued, what it runs)
        key = (self.now, len(self.requests), self.arrivals.num_sent, self.replay.accounting.num_steps,
               len(scheduler.running), len(scheduler.waiting))
        if self._done_bound is None or self._done_bound[0] != key:
            self._done_bound = key, self._next_done_s()
        return self._done_bound[1]

    def _next_done_s(self) -> float:
        scheduler, allocator = self.replay.scheduler, self.replay.allocator
        if scheduler.waiting or self.arrivals.has_pending or not scheduler.can_bulk \
                or (allocator.windowed and allocator.shared_slots):
            return self.ready_s
        # (the profile's steps stop at the first finish: ``decode_state`` bounds them by the fewest tokens left)
        lengths, allocated, finals, most_steps, _ = decode_state(allocator, scheduler.running, scheduler.passes)
        grown = allocator.bulk_profile(lengths, allocated, finals, most_steps).num_steps
        return self.now + grown * self.min_step_s

    def send(self, request: Request, fleet_index: int, at: float) -> None:
        """Hand the replica a request that reaches it at ``at`` (mid-step, it waits for the step's end)."""
        self.requests.append(request if request.arrival_s == at else request.arriving_at(at))
        self.fleet_indices.append(fleet_index)

    def sent_all(self) -> None:
        """The replica has been sent every request it will get, before its replay started (``Fleet.routes_ahead``):
        from here on its bulk advances run on through arrivals behind a waiting head, as ``simulate``'s do."""
        self.replay.bulk_advance.through_arrivals = self.through_arrivals

    def iterate(self, horizon_s: float | None) -> None:
        """One pass of the replay's loop; ``horizon_s``: when the router may next send a request (None: never)."""
        if self.events is not None:
            self.events.publish()  # the step before this pass has ended
        self.arrivals.horizon_s = horizon_s
        self.replay.scheduler.arrive(self.now)  # (the replay's pass queues nothing more at ``now``)
        if self.arrivals.done:
            # A request refused on arrival: its client hears it before the step starts, and may send another
            # that this step takes, as on one engine (``Arrivals.due`` goes on after a refusal)
            return
        self.replay.iterate()
        if not self.keeps_state:
            return
        self._before, self._state = self._state, self._read_state()
        if self.timeline is not None:
            state = self._state
            self.timeline.append((self.now, state.num_waiting + state.num_running, 100.0 * state.kv_usage))

    def state_at(self, at: float) -> ReplicaState:
        """The replica as a router sees it at ``at``: as of its last step ended by then."""
        assert self.keeps_state, "a router read a replica built for routers that read none (read_by_router)"
        if self.now <= at:
            if self.events is not None:
                self.events.publish()
            return self._state
        return self._before

    def load(self, state: ReplicaState) -> tuple[int, float, int]:
        """What a router weighs, from the replica's ``state_at`` the moment it routes: the queue (requests waiting
        at its last published step, plus those the router sent since), the KV usage, the requests running."""
        return state.num_waiting + len(self.requests) - state.num_arrived, state.kv_usage, state.num_running

    def take_finished(self) -> list[tuple[LiveRequest, float]]:
        """The sequences finished since the last call, with their finish times (the replica keeps none)."""
        finished, self._finished = self._finished, []
        return finished

    def take_done(self) -> list[tuple[int, float, bool, int]]:
        """The requests done since the last call (finished or rejected): (fleet index, time, completed, cached
        prompt tokens)."""
        done, self.arrivals.done = self.arrivals.done, []
        return [(self.fleet_indices[index], now, completed, cached) for index, now, completed, cached in done]

    def _sample_done(self, live: LiveRequest, now: float) -> None:
        self._finished.append((live, now))

    def metrics(self) -> StrategyMetrics:
        """``simulate``'s metrics of this replica's replay (the same fields)."""
        return self.replay.metrics()

    def _read_state(self) -> ReplicaState:
        scheduler, allocator = self.replay.scheduler, self.replay.allocator
        return ReplicaState(len(scheduler.waiting), len(scheduler.running),
                            allocator.used_slots / allocator.capacity_tokens, self.arrivals.num_sent)
