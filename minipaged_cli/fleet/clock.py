"""The fleet's one discrete-event clock (SPEC section 9): replicas step on their own and idle when out of work; at a
moment T the steps ending at T complete, then the requests arriving at T (trace order; then KV transfers landing at
T) are routed one by one, then idle replicas admit what they were sent and start a step. A request that reaches a
replica mid-step waits for the step's end, as in vLLM's engine loop.

The replica whose clock is earliest always runs next, so no replica runs past a moment another one's event
(a prefill finishing, a transfer landing) could change what it is sent. Cost: a pass per step of each replica,
as many steps as the requests need, whatever the number of replicas (bulk decode advances included); the earliest
replica is a heap's head, not a scan of every replica each pass.

``reaction_s``: when a finish may send a request (a session's next turn, a closed-loop client's next request, a
capped client's queue), at least this long after it, a replica's bulk advance also stops where another replica's
finish may send one: the earliest moment another one's next pass starts (``Replica.ready_s``; a finish comes at
a pass's end, a refusal at its start) plus ``reaction_s``, so no request is sent to a replica already past the
moment it was sent. The steps are the same; bulk advances are cut shorter, the more so the shorter the reaction
(a closed loop or a binding cap sends at once: the replicas then take turns, a few steps each).

``bound_finishes``: when no router reads what a replica publishes (round-robin), the bound is another replica's
next possible finish or refusal (``Replica.next_done_s``: its running sequence closest to its end, a token a step
of the shortest step it could take, no later than its first step that might preempt) rather than its next pass,
so the replicas take turns many steps at a time (a landing still bounds a decode replica by a prefill replica's
next pass: a prefill's end is no finish). A
router that reads load, KV usage or prefixes sees a replica as of its last pass's end (a bulk advance publishes
at its end), so there the passes stay as short as the next pass allows, as the routers' decisions were measured.

``landing_s`` (P/D: the KV link's latency, the shortest time from a prefill's end to its KV landing): a decode
replica's bulk advance also stops at the earliest moment a prefill replica's next pass starts plus ``landing_s``,
so it never runs past a landing it could receive (a prefill replica that ends its pass later than the decode
replica's clock, as a chunked prompt's first chunk does, has not yet scheduled the landing). The request then
joins the decode replica's first step that starts after it landed, as in vLLM's engine loop
(``WAITING_FOR_REMOTE_KVS`` until the KV has arrived, then the next step schedules it).

vLLM: vllm/v1/core/sched/scheduler.py::Scheduler._update_waiting_for_remote_kv
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any

from minipaged_cli.fleet.replica import Replica


class FleetClock:
    """Events at known times (arrivals, landings), and the replicas advanced between them."""

    def __init__(self, replicas: Sequence[Replica], *, reaction_s: float = math.inf,
                 landing_s: float = math.inf, bound_finishes: bool = False) -> None:
        self.replicas = list(replicas)
        self.reaction_s = reaction_s
        self.landing_s = landing_s
        self.bound_finishes = bound_finishes
        self.events: list[tuple[float, int, Any]] = []  # (time, order, payload): a heap
        self._order = 0
        self.scan = False  # choose each pass by scanning every replica (``_advance_scanning``: the reference)

    def schedule(self, at: float, payload: Any) -> None:
        heapq.heappush(self.events, (at, self._order, payload))
        self._order += 1

    @property
    def next_event_s(self) -> float:
        return self.events[0][0] if self.events else math.inf

    def advance(self, on_pass: Callable[[Replica], None]) -> None:
        """Run the earliest busy replica one pass at a time until every busy replica has reached the next event
        (which a pass may bring closer: ``on_pass`` may schedule one)."""
        if self.reaction_s < math.inf or self.landing_s < math.inf:
            self._advance_looking_ahead(on_pass)
            return
        if self.scan:
            self._advance_scanning(on_pass)
            return
        # The busy replicas by (clock, index): a pass changes only its own replica's clock and work (a request
        # reaches a replica between two ``advance`` calls, never during one), and the next event only comes
        # closer, so the heap's head is the scan's choice.
        busy = [(r.now, r.index, r) for r in self.replicas if r.has_work]
        heapq.heapify(busy)
        while busy:
            now, _, replica = busy[0]
            until = self.next_event_s
            if now >= until:
                return
            replica.iterate(None if until == math.inf else until)
            on_pass(replica)
            if replica.has_work:
                heapq.heapreplace(busy, (replica.now, replica.index, replica))
            else:
                heapq.heappop(busy)

    def _advance_scanning(self, on_pass: Callable[[Replica], None]) -> None:
        """``advance`` as the rule reads: each pass, the earliest busy replica short of the next event (the
        reference the heap is tested against)."""
        while True:
            until = self.next_event_s
            replica = min((r for r in self.replicas if r.has_work and r.now < until), default=None,
                          key=lambda r: (r.now, r.index))
            if replica is None:
                return
            replica.iterate(None if until == math.inf else until)
            on_pass(replica)

    def _advance_looking_ahead(self, on_pass: Callable[[Replica], None]) -> None:
        """``advance``, the replica whose next pass starts earliest first, each up to the others' next start plus
        the reaction time (a decode replica: a prefill replica's next start plus the landing time, if sooner)."""
        while True:
            until = self.next_event_s
            ready = sorted((r.ready_s, r.index, r) for r in self.replicas if r.has_work and r.ready_s < until)
            if not ready:
                return
            replica = ready[0][2]
            horizon = until
            for ready_s, _, other in ready[1:]:
                if replica.role == "decode" and other.role == "prefill":
                    horizon = min(horizon, ready_s + self.landing_s)
                if self.reaction_s < math.inf:
                    horizon = min(horizon, (other.next_done_s if self.bound_finishes else ready_s) + self.reaction_s)
            replica.iterate(None if horizon == math.inf else horizon)
            on_pass(replica)

    def pop_due(self) -> tuple[float, list[Any]]:
        """The earliest time and the payloads of every event then, in the order scheduled ([] when none is left)."""
        if not self.events:
            return math.inf, []
        at = self.events[0][0]
        due = []
        while self.events and self.events[0][0] == at:
            due.append(heapq.heappop(self.events)[2])
        return at, due
