"""The clients: when each request of a trace is sent to the engine (the replay's arrivals).

- ``open`` (the default): at the trace's arrival times, as today; a session's turn when every turn it waits for
  has finished, plus its delay (think time, tool latency).
- ``closed`` (``--concurrency N``, AIPerf's and genai-perf's ``--concurrency``): N clients; each takes the next
  session or standalone request, in trace order, when its previous one is done (the trace's arrival times are
  not used: the clients start together at the trace's first arrival); inside a session the delays still apply.
- ``capped`` (``--max-concurrency N``, ``vllm bench serve``'s): sent as ``open`` would, but at most N in flight;
  the others wait in the client, first come first served, and that wait is reported beside TTFT, not in it (a
  request's TTFT counts from when it is sent, as the benchmark's does).

A request is sent at most once, never before everything it waits for has finished; a turn whose predecessor was
rejected is never sent (the session ends there, as a server's refusal ends a conversation): it is counted
``not_sent``. Finishes happen at step ends, where the replay asks for arrivals next, so a slot a finish frees at
``now`` is taken at ``now``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from minipaged_cli.errors import InputError
from minipaged_cli.workloads.trace import Request, Trace

CLIENT_KINDS = ("open", "closed", "capped")


@dataclass(frozen=True)
class Clients:
    """``concurrency``: closed loop of that many clients; ``max_concurrency``: open loop capped at that many in
    flight; neither: open loop."""

    concurrency: int | None = None
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.max_concurrency is not None:
            raise InputError("give {concurrency} (closed loop) or {max_concurrency} (open loop, capped), not both",
                             field="{max_concurrency}", value=self.max_concurrency, has_value=True)
        for option, value in (("{concurrency}", self.concurrency), ("{max_concurrency}", self.max_concurrency)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InputError("must be a whole number >= 1", field=option, value=value, has_value=True)

    @property
    def kind(self) -> str:
        if self.concurrency is not None:
            return "closed"
        return "capped" if self.max_concurrency is not None else "open"


OPEN_LOOP = Clients()


class Arrivals:
    """The trace's requests as the clients send them: ``due(now)`` yields those sent by ``now`` (index in the
    trace, the request with its send time as ``arrival_s``), ``finished`` hears when one is done.

    Per request (index in ``trace.requests``): ``due_s`` when the client wanted it sent, ``sent_s`` when it was
    (later only under a cap), ``finish_s`` and ``cached_tokens`` once finished; NaN where it never happened.

    One engine's scheduler drives it (its arrivals); a fleet drives one for all its replicas on the fleet's clock
    (``fleet/fleet.py``), which reads ``min_reaction_s`` to know how far a replica may run ahead of a finish.
    """

    def __init__(self, trace: Trace, clients: Clients) -> None:
        requests = self.requests = trace.requests
        n = len(requests)
        self.cap = clients.max_concurrency or math.inf
        self.start_s = requests[0].arrival_s if requests else 0.0
        self.due_s = [math.nan] * n
        self.sent_s = [math.nan] * n
        self.finish_s = [math.nan] * n
        self.cached_tokens = [0] * n
        self.completed = [False] * n
        self.num_pending = n  # neither sent nor given up
        self.num_not_sent = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.freed_now = 0  # slots finishes freed since the last ``due``: they were free only from ``now``
        self.heap: list[tuple[float, int]] = []  # (due time, index) of requests whose time is known
        self.queued: deque[tuple[float, int]] = deque()  # due, held by the cap
        self.unmet = [0] * n  # requests each still waits for
        self.children: dict[int, list[int]] = {}
        self.delay_s = [0.0] * n
        position = {r.id: i for i, r in enumerate(requests)} if trace.turns else {}
        for index, request in enumerate(requests):
            link = trace.turns.get(request.id)
            if link is None:
                continue
            self.delay_s[index] = link.delay_s
            self.unmet[index] = len(link.after)
            for earlier in link.after:
                self.children.setdefault(position[earlier], []).append(index)
        # Closed loop: units of work (a session, or a standalone request), in trace order, and who runs each.
        self.closed = clients.concurrency is not None
        if self.closed:
            units: dict[str, list[int]] = {}
            for index, request in enumerate(requests):
                link = trace.turns.get(request.id)
                units.setdefault(f"session {link.session}" if link else f"request {index}", []).append(index)
            self.units = list(units.values())
            self.unit_of = [0] * n
            for number, members in enumerate(self.units):
                for index in members:
                    self.unit_of[index] = number
            self.unit_left = [len(members) for members in self.units]
            self.next_unit = 0
            for _ in range(min(clients.concurrency, len(self.units))):
                self._start_unit(self.start_s)
        else:
            self.heap = [(r.arrival_s, i) for i, r in enumerate(requests) if not self.unmet[i]]
            heapq.heapify(self.heap)  # (already one: the trace is sorted by arrival)
        # The least time from a finish to a request it sends (infinite: no finish sends one): a turn's delay after
        # what it waits for; a closed-loop client's next unit's delays; under a cap that binds, none
        self.min_reaction_s = min((self.delay_s[i] for i in range(n) if self.unmet[i]), default=math.inf)
        if self.closed:
            starts = min((self.delay_s[i] for i in range(n) if not self.unmet[i]), default=math.inf)
            self.min_reaction_s = min(self.min_reaction_s, starts)
        if self.cap < n:
            self.min_reaction_s = 0.0

    @property
    def has_pending(self) -> bool:
        return self.num_pending > 0

    @property
    def next_arrival_s(self) -> float | None:
        """When the next request is sent, if no request finishes before; None: none until one does."""
        if self.in_flight >= self.cap:
            return None
        if self.queued:
            return self.queued[0][0]
        return self.heap[0][0] if self.heap else None

    def due(self, now: float) -> Iterable[tuple[int, Request]]:
        """The requests sent by ``now``, in the order sent (``finished`` may be called between two). (At most passes
        of a replay none is due: then no generator is made.)"""
        heap, queued = self.heap, self.queued
        if (not heap or heap[0][0] > now) and (not queued or self.in_flight >= self.cap):
            self.freed_now = 0  # (what the generator's end does)
            return ()
        return self._sent(now)

    def _sent(self, now: float) -> Iterator[tuple[int, Request]]:
        """``due``'s generator."""
        heap, queued = self.heap, self.queued
        while True:
            while heap and heap[0][0] <= now:
                queued.append(heapq.heappop(heap))
            if not queued or self.in_flight >= self.cap:
                break
            due_s, index = queued.popleft()
            sent_s = due_s
            if self.in_flight + self.freed_now >= self.cap:  # no slot was free before the finishes at ``now``
                sent_s = now
                self.freed_now -= 1
            self.due_s[index], self.sent_s[index] = due_s, sent_s
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.num_pending -= 1
            request = self.requests[index]
            yield index, request if request.arrival_s == sent_s else request.arriving_at(sent_s)
        self.freed_now = 0

    def finished(self, index: int, now: float, *, completed: bool, cached_tokens: int) -> None:
        """Request ``index`` is done (completed, or rejected: then whatever waits for it is never sent)."""
        assert math.isnan(self.finish_s[index]) and not math.isnan(self.sent_s[index]), \
            f"request {index} finished twice, or before it was sent: the scheduler reports a request once, when sent"
        self.in_flight -= 1
        self.freed_now += 1
        self.finish_s[index] = now
        self.completed[index] = completed
        self.cached_tokens[index] = cached_tokens
        if self.closed:
            self._unit_done(index, now)
        for child in self.children.get(index, ()) if self.children else ():
            if self.unmet[child] < 0:  # (already given up)
                continue
            if not completed:
                self._give_up(child, now)
                continue
            self.unmet[child] -= 1
            if not self.unmet[child]:
                heapq.heappush(self.heap, (now + self.delay_s[child], child))

    def _give_up(self, index: int, now: float) -> None:
        """A request whose predecessor was rejected, and all that waits for it: never sent."""
        stack = [index]
        while stack:
            current = stack.pop()
            if self.unmet[current] < 0:
                continue
            self.unmet[current] = -1
            self.num_pending -= 1
            self.num_not_sent += 1
            self._unit_done(current, now)
            stack.extend(self.children.get(current, ()))

    def _start_unit(self, now: float) -> None:
        for index in self.units[self.next_unit]:
            if not self.unmet[index]:
                heapq.heappush(self.heap, (now + self.delay_s[index], index))
        self.next_unit += 1

    def _unit_done(self, index: int, now: float) -> None:
        """Closed loop: a client whose session (or request) is done takes the next one."""
        if not self.closed:
            return
        unit = self.unit_of[index]
        self.unit_left[unit] -= 1
        if not self.unit_left[unit] and self.next_unit < len(self.units):
            self._start_unit(now)
