"""One tier below the GPU and what the tiers report: per-tier metrics, and the invariants they keep.

The metrics are per replay (``TierMetrics``); the invariants (``tier_violations``) are checked after every step
when the replay checks invariants: ``sim/tiers.py``'s docstring states them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from minipaged_cli.memory.tier_store import TierStore
from minipaged_cli.sim.tier_links import Link
from minipaged_cli.units import rounded


class Tier:
    """One tier: its store, its write (down) and read (up) links, and what happened in it."""

    def __init__(self, name: str, store: TierStore, write: Link, read: Link) -> None:
        self.name, self.store, self.write, self.read = name, store, write, read
        self.hit_tokens = 0  # prompt tokens loaded from here, at a request's first admission (its query)
        self.recomputed_tokens = 0  # found here, but recomputing them was faster
        self.stored_blocks = 0
        self.loaded_blocks = 0
        self.dropped_blocks = 0  # stores the tier had no room for beside the ones in flight
        # (copy's end, blocks) of the stores issued, in order
        self.in_flight: deque[tuple[float, list[Hashable]]] = deque()
        self.num_in_flight = 0  # blocks in ``in_flight``
        self.store_wait_s = 0.0  # seconds from each store's issue to its copy's end, summed
        self.swap_out_bytes = 0  # v0's swapped-out KV, over the write link (host tier only)


@dataclass(frozen=True)
class TierMetrics:
    """What one tier did over a replay. Percentages: hits of the prompt tokens looked up, busy of the makespan."""

    name: str
    capacity_blocks: int
    hit_tokens: int
    hit_pct: float
    recomputed_tokens: int
    stored_bytes: int  # cached blocks written into the tier (swapped-out KV is the strategy's swap_out_bytes)
    loaded_bytes: int  # read out of it towards the GPU
    dropped_stores: int  # blocks
    store_wait_s: float  # from each store's issue to its copy's end, summed: a bound on the waits not charged
    evictions: int
    write_busy_pct: float  # every copy down the link: stores, and v0's swap-outs
    read_busy_pct: float  # every copy up: loads, and v0's swap-ins

    def to_dict(self) -> dict[str, Any]:
        return rounded(self.__dict__)


def tier_metrics(tiers: Sequence[Tier], bytes_per_block: int, prompt_tokens: int,
                 makespan_s: float) -> dict[str, TierMetrics]:
    """Per tier, over a replay whose first admissions looked up ``prompt_tokens`` and lasted ``makespan_s``."""
    def pct(part: float, whole: float) -> float:
        return 100.0 * part / whole if whole else 0.0

    return {tier.name: TierMetrics(
        name=tier.name, capacity_blocks=tier.store.capacity, hit_tokens=tier.hit_tokens,
        hit_pct=pct(tier.hit_tokens, prompt_tokens), recomputed_tokens=tier.recomputed_tokens,
        stored_bytes=tier.stored_blocks * bytes_per_block,
        loaded_bytes=tier.loaded_blocks * bytes_per_block,
        dropped_stores=tier.dropped_blocks, store_wait_s=tier.store_wait_s,
        evictions=tier.store.num_evictions, write_busy_pct=pct(tier.write.busy_s, makespan_s),
        read_busy_pct=pct(tier.read.busy_s, makespan_s)) for tier in tiers}


def tier_violations(tiers: Sequence[Tier], bytes_per_block: int,
                    on_gpu: Callable[[Hashable], bool] | None) -> list[str]:
    """The broken invariants of ``tiers``, each named. ``on_gpu``: whether the GPU's prefix cache holds a key,
    under exclusive tiers (a block is then in one place); None otherwise."""
    found = [f"{tier.name}: {v}" for tier in tiers for v in tier.store.violations()]
    if on_gpu is not None:
        above: set[Hashable] = set()
        for tier in tiers:  # (a block leaving for the GPU is in both until its load's copy ends)
            leaving = tier.store.leaving
            if any(not on_gpu(key) and key not in above for key in leaving):
                found.append(f"{tier.name}: a block leaving for the GPU is neither there nor in a tier above: "
                             "it came back down and the tier did not keep it")
            hashes = [key for key in tier.store.hashes() if key not in leaving]
            if any(map(on_gpu, hashes)):
                found.append(f"{tier.name}: holds blocks the GPU's prefix cache holds, under exclusive tiers: "
                             "a block the GPU cached was not removed from the tier")
            if not above.isdisjoint(hashes):
                found.append(f"{tier.name}: holds blocks a tier above holds, under exclusive tiers: a block "
                             "went down without leaving the tier above, or came up without leaving this one")
            above.update(hashes)
    for tier in tiers:
        if tier.write.num_bytes != tier.stored_blocks * bytes_per_block + tier.swap_out_bytes:
            found.append(f"{tier.name}: bytes written differ from blocks stored x bytes per block + bytes "
                         "swapped out")
    return found
