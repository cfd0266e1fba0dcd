"""The latencies of a replay's finished requests, kept as numbers only: a replay's memory must not grow by a
request's records each time one finishes (``Accounting`` reports from them)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import numpy as np

from minipaged_cli.sim.live_request import LiveRequest


class Latencies:
    """The latencies of finished sequences and completed requests, each kept as one float64 (8 bytes a figure,
    nothing of the request itself): the exact percentiles need every value, and a replay's memory must not grow
    by a request's records each time one finishes.

    Invariants: the values are in the order the sequences finished (for ``e2e_s``, the order a request's first
    sample finished), so the means over them are the means over the lists they replace, to the last digit; a
    request enters ``e2e_s`` at its first finished sample, unless rejected, and holds its latest sample's finish;
    ``pending`` holds only requests with samples still running, so it is bounded by the running requests.
    """

    def __init__(self) -> None:
        self.ttft_s = array("d")  # per request (its sample 0): first token - arrival
        self.tpot_s = array("d")  # per finished sample of more than one output token
        self.e2e_s = array("d")  # per request: its latest finished sample's finish - arrival
        self.normalized_s = array("d")  # per request: e2e_s / output tokens
        self.pending: dict[int, int] = {}  # request index -> its slot in e2e_s, while it has samples left
        self.dropped: set[int] = set()  # slots of requests rejected after a sample finished
        self.output_tokens = 0  # of every finished sample
        self.last_finish_s: float | None = None

    def sample_done(self, live: LiveRequest, now: float, samples_left: int, rejected: bool) -> None:
        """``live`` finished at ``now``; ``samples_left``: its request's samples still running after it;
        ``rejected``: one of them was rejected (the request is not completed: no end-to-end latency)."""
        self.output_tokens += live.output_tokens
        self.last_finish_s = now  # (the replay's clock never goes back)
        if live.sample == 0:
            self.ttft_s.append(live.first_token_s - live.request.arrival_s)
        if live.output_tokens > 1:
            self.tpot_s.append((now - live.first_token_s) / (live.output_tokens - 1))
        if rejected:
            return
        seconds = now - live.request.arrival_s
        slot = self.pending.pop(live.request_index, None) if self.pending else None
        if slot is None:  # the request's first finished sample: its place in the order
            if samples_left:
                self.pending[live.request_index] = len(self.e2e_s)
            self.e2e_s.append(seconds)
            self.normalized_s.append(seconds / live.output_tokens)
            return
        self.e2e_s[slot] = seconds
        self.normalized_s[slot] = seconds / live.output_tokens
        if samples_left:
            self.pending[live.request_index] = slot

    def rejected(self, request_index: int) -> None:
        """A sample of the request was rejected: a latency it entered leaves (the request did not complete)."""
        slot = self.pending.pop(request_index, None)
        if slot is not None:
            self.dropped.add(slot)

    def request_latencies(self) -> tuple[np.ndarray, np.ndarray]:
        """(end-to-end, normalized) latencies of the requests not rejected, [num_requests] float64 each."""
        e2e, normalized = np.frombuffer(self.e2e_s), np.frombuffer(self.normalized_s)
        if self.dropped:
            kept = np.ones(len(e2e), dtype=bool)
            kept[list(self.dropped)] = False
            e2e, normalized = e2e[kept], normalized[kept]
        return e2e, normalized


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """``float(np.percentile(values, q))`` to the last digit (numpy's default: linear interpolation between the two
    closest ranks, ``(n - 1) * q / 100``), without ``np.percentile``'s first call importing ``numpy.ma`` (through
    ``np.unique``): about 9 ms, 4% of a one-request ``simulate``'s start-up.
    ``values``: at least one, none NaN. (``tests/sim/test_percentile.py`` checks it against ``np.percentile``.)"""
    ordered = np.sort(values)
    position = (len(ordered) - 1) * (q / 100)
    below = math.floor(position)
    if below >= len(ordered) - 1:
        return float(ordered[-1])
    low, high, weight = float(ordered[below]), float(ordered[below + 1]), position - below
    # (numpy's lerp: from the nearer end, so that a weight of 1 gives the upper value exactly)
    return high - (high - low) * (1 - weight) if weight >= 0.5 else low + (high - low) * weight
