"""``minipaged run`` with a host tier: the simulator's moves of each step (``StepWork.stores``/``loads``,
``sim/tiers.py``) executed on a ``HostKVPool`` of real host memory, beside the step's cache writes and attention.

When the copies run, relative to the step's compute:

- ``write-through``: the blocks the step computed are stored after its compute (they hold its K/V then);
- ``on-eviction``: the blocks the step's allocation evicts are stored before its compute overwrites them;
- loads, in the step that issues them (vLLM's worker starts a load's copy then; the request computes once the
  simulator's clock says it has ended), fill the blocks a hit was allocated before the step's compute reads them
  (after the on-eviction stores: an evicted block may be the very one a load fills).

The pool holds what the simulator's host tier holds, and the blocks the step loads: a hash the host tier has
evicted is discarded from the pool when its slot is needed, unless the step loads it. The simulator hands a step's
moves over after the step's stores, which may evict a block loaded in the step (the tier pins a load's blocks
only until its copy ends, and a short one ends within the step), so the pool has room for the tier's blocks and
one step's loads besides (``StepOffload.under``). A hash the step stores is one the tier did not hold (it evicted
it, or under exclusive tiers gave it up to the GPU): a slot the pool still has for it is stale and goes first,
so that the copy runs as the simulator counts it. The disk tier is not executed.
"""

from __future__ import annotations

from collections.abc import Container, Hashable
from dataclasses import dataclass

from minipaged_cli.dataplane.backends import Backend
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.dataplane.offload import HostKVPool
from minipaged_cli.sim.replay import StepWork
from minipaged_cli.sim.settings import TierSettings
from minipaged_cli.units import rounded


@dataclass(frozen=True)
class OffloadStats:
    """What the host tier's copies moved and how long the copies took (device <-> host, each way)."""

    host_blocks: int  # the host tier's capacity
    stored_blocks: int
    loaded_blocks: int
    stored_bytes: int
    loaded_bytes: int
    store_s: float
    load_s: float

    @property
    def store_gbps(self) -> float:
        return self.stored_bytes / self.store_s / 1e9 if self.store_s else 0.0

    @property
    def load_gbps(self) -> float:
        return self.loaded_bytes / self.load_s / 1e9 if self.load_s else 0.0

    def to_dict(self) -> dict[str, float | int]:
        return rounded({**self.__dict__, "store_gbps": self.store_gbps, "load_gbps": self.load_gbps})


class StepOffload:
    """Executes each step's tier moves on ``pool`` (``before_compute``, ``after_compute``: the run's executor
    calls them around the step's cache writes and attention)."""

    def __init__(self, pool: HostKVPool, write_through: bool, *, tier_blocks: int | None = None) -> None:
        self.pool = pool
        self.write_through = write_through
        self.tier_blocks = pool.num_slots if tier_blocks is None else tier_blocks
        self.stored_blocks = 0
        self.loaded_blocks = 0

    @classmethod
    def under(cls, cache: PagedKVCache, backend: Backend, tiers: TierSettings) -> StepOffload:
        """The host tier of ``tiers`` on a pool of real host memory: the tier's blocks and one step's loads (at
        most the tier's blocks, and no more than ``cache``, the GPU pool, holds)."""
        tier_blocks = tiers.cpu_kv_blocks
        pool = HostKVPool(cache, backend, tier_blocks + min(tier_blocks, cache.num_blocks))
        return cls(pool, tiers.offload_policy == "write-through", tier_blocks=tier_blocks)

    def before_compute(self, work: StepWork) -> None:
        if not self.write_through:
            self._store(work, {block_hash for block_hash, _ in work.loads})
        if work.loads:
            self.loaded_blocks += self.pool.load(work.loads).num_blocks

    def after_compute(self, work: StepWork) -> None:
        if self.write_through:
            self._store(work, ())

    def stats(self) -> OffloadStats:
        pool = self.pool
        pool.synchronize()
        return OffloadStats(host_blocks=self.tier_blocks, stored_blocks=self.stored_blocks,
                            loaded_blocks=self.loaded_blocks, stored_bytes=pool.bytes_moved["store"],
                            loaded_bytes=pool.bytes_moved["load"], store_s=pool.link_seconds["store"],
                            load_s=pool.link_seconds["load"])

    def _store(self, work: StepWork, loading: Container[Hashable]) -> None:
        """Copy the step's stores into the pool; where it has no room, first discard what the simulator's host tier
        no longer holds (``work.tiers``: the replay's tiers, as the step left them) unless the step loads it."""
        pairs = work.stores
        if not pairs:
            return
        pool = self.pool
        pool.discard([block_hash for block_hash, _ in pairs])  # (stale slots: the module docstring)
        if len(pairs) > pool.num_free_slots:  # the host tier evicted some to take these: so does the pool
            assert work.tiers is not None, "a step that stores blocks comes from a replay with tiers"
            host_holds = work.tiers.host_holds
            pool.discard([h for h in list(pool.slots) if not host_holds(h) and h not in loading])
        self.stored_blocks += pool.store(pairs).num_blocks
