"""A picture of the physical KV memory over time: which request owns each slot (``simulate --plot-layout``).

Samples are columns of ``rows`` slot addresses spread evenly over the capacity (row ``r`` shows the slot at
``r * capacity / rows``: at 100,000+ blocks every block cannot be drawn, and one slot per row keeps holes and
scatter visible). A sample is taken when the simulated clock passes the next sampling time; when the samples
outnumber twice ``columns``, every other one is dropped and the interval doubles, so a replay of any length ends
with between ``columns`` and ``2 * columns`` evenly spaced samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minipaged_cli.memory.allocators import Allocator

FREE = -1


@dataclass
class LayoutSamples:
    times_s: np.ndarray  # [samples]
    owners: np.ndarray  # [rows, samples]: the owning sequence's id, FREE where nobody holds the slot
    capacity_tokens: int


class LayoutRecorder:
    def __init__(self, capacity_tokens: int, first_interval_s: float, rows: int = 500, columns: int = 400) -> None:
        self.capacity_tokens = capacity_tokens
        self.slots = (np.arange(rows, dtype=np.int64) * capacity_tokens) // rows
        self.columns = columns
        self.interval_s = max(first_interval_s, 1e-6)
        self.next_s = 0.0
        self.times: list[float] = []
        self.samples: list[np.ndarray] = []

    def maybe_record(self, now: float, allocator: Allocator) -> None:
        if now < self.next_s:
            return
        self.times.append(now)
        self.samples.append(allocator.slot_owners(self.slots))
        self.next_s = now + self.interval_s
        if len(self.samples) > 2 * self.columns:
            self.times, self.samples = self.times[::2], self.samples[::2]
            self.interval_s *= 2

    def result(self) -> LayoutSamples:
        owners = np.stack(self.samples, axis=1) if self.samples else np.full((len(self.slots), 0), FREE)
        return LayoutSamples(np.asarray(self.times), owners, self.capacity_tokens)
