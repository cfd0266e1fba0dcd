"""The prefix cache's tiers below the GPU: host memory, and local disk under it, each a capacity and a link.

``TieredCache`` subscribes to the GPU pool's events (``memory/pool_events.py``) and holds the tiers' state; its
concerns live beside it: the stores (``sim/tier_stores.py``: when a block goes down, when a store is dropped), the
loads (``sim/tier_loads.py``: the lookup, the load-or-recompute rule, the pins, KV cache groups), the links' clocks
(``sim/tier_links.py``) and the per-tier report and invariants (``sim/tier_report.py``); v0's swaps are here.

What it models follows vLLM 0.33.0's OffloadingConnector and the systems issue 24 names (LMCache, SGLang HiCache,
Dynamo KVBM, Mooncake Store):

- **Eviction** in each tier: LRU or ARC (``memory/tier_store.py``); reuse is a load. (Under ``exclusive`` a
  reused block leaves the tier as its load ends and comes back, seen once, when the GPU evicts it: ARC's T2 holds
  a block only in between, so ARC acts nearly as LRU.)
- **Inclusion.** ``inclusive`` (the default): a load copies, and the tier keeps its copy (vLLM's CPU LRU, LMCache,
  HiCache), so the GPU and the tiers below may spend capacity on the same block. ``exclusive`` (with
  ``on-eviction`` only): a victim-cache hierarchy, which none of the systems cited ships (it shows what
  inclusivity costs): a block the GPU caches, loaded or computed, leaves every tier below at once (the pool's
  ``cached`` report), and goes down again, to the host tier, when the GPU evicts it; a block the host tier evicts
  goes to the disk tier, and one loaded from the disk leaves it, so each block is in one tier. A load's blocks
  leave their tier when they join the GPU's prefix cache (the load done), not at its issue: meanwhile they are
  pinned there, as under ``inclusive``, and take their room while the blocks the load's allocation evicts come
  down; a block the GPU caches while a load still reads it (the loading request resumed early under
  ``layerwise_loads``, or another request computed the block) leaves once that copy ends. A load declined by the
  load-or-recompute rule: the tier keeps the blocks until the GPU caches the ones it recomputes (a request
  preempted first leaves them in the tier), as a block is in one tier, and the GPU's fresh copy is the one reused
  next. Under v0 the swapped-out blocks are no cached content (a request's own KV, moved out and back: exclusive by
  nature) and are as under ``inclusive``.
- **Swap (vLLM v0).** Under ``--scheduler v0`` the host tier is also the swap space (v0's ``--swap-space``): a
  swapped-out request's blocks take host-tier slots (``TierStore.reserve``: cached blocks are evicted for them,
  swapped blocks are never evicted) until it swaps back in. Its bytes cross the same host link as the stores and
  loads: v0's worker copies ``blocks_to_swap_in`` then ``blocks_to_swap_out`` (``cudaMemcpyAsync`` on the compute
  stream) before the step's forward, so each copy waits for the link direction it uses and for the copies before
  it (here in the order the scheduler decides them: swap-outs, then each admission's swap-in or load), and the
  forward for the last of them (``swap_out``, ``swap_in``: the step's duration pays it). v0 had no asynchronous KV
  connector: a load from the host tier is issued the same way, in the step that admits the request, and the
  forward waits for it.

Where it differs from vLLM: one block per offloaded chunk (vLLM can group several GPU blocks into one chunk);
a finished load re-enters the running list, not the waiting queue; a loading request can be preempted (vLLM's
waits outside the running list); a block being written may be evicted from its tier meanwhile (vLLM pins it, as
it and this module pin a block being read); a load may read a block whose store has not ended (vLLM's lookup
answers ``HIT_PENDING`` and defers the request); a step's stores are admitted or dropped as one copy (vLLM's
scheduler calls ``prepare_store`` once per request and, where it returns None, skips that request's store and goes
on to the next: ``continue``); loads and stores are times on a clock, not copies (``StepWork.loads``/``stores``
hand them to a data plane).

Invariants (``violations``): each tier within its capacity (cached and swapped blocks together), each hash once per
tier, every pinned block stored; bytes written = blocks stored x bytes per block + bytes swapped out; under
``exclusive``, no block held by the GPU's prefix cache and a tier below at once, nor by two tiers, but a block
leaving for the GPU while a load reads it (``TierStore.leaving``): a block whose load is in flight is in its tier
and, unless leaving, not yet in the GPU's prefix cache (it leaves the tier when it joins), and one whose store is
in flight is in the tier's store (booked at the store's issue) and not in the GPU's prefix cache (the flush skips
the blocks cached again, and a block cached later leaves the tier).

vLLM: vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py::OffloadingConnector
vLLM: vllm/worker/cache_engine.py::CacheEngine.swap_in (v0)
vLLM: vllm/worker/cache_engine.py::CacheEngine.swap_out (v0)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from itertools import compress

from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.kv_groups import KVCacheGroup, block_bytes
from minipaged_cli.memory.paged import PagedAllocator
from minipaged_cli.memory.sequence import num_blocks_for
from minipaged_cli.memory.tier_store import TIER_STORES
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.settings import TierSettings
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.sim.tier_links import Link
from minipaged_cli.sim.tier_loads import TierLoads, sliding_hit_end
from minipaged_cli.sim.tier_report import Tier, TierMetrics, tier_metrics, tier_violations
from minipaged_cli.sim.tier_stores import TierStores

# (Link and sliding_hit_end: imported from here by the fleet and the tests, as before the split)
__all__ = ["Link", "TierMetrics", "TieredCache", "sliding_hit_end"]


class TieredCache(TierStores, TierLoads):
    """The tiers under one GPU pool: a subscriber of its events (what it caches and evicts), with its stores
    (``TierStores``) and loads (``TierLoads``) mixed in; without a pool (a contiguous strategy swapping under v0)
    the host tier is only the swap space."""

    @classmethod
    def under(cls, allocator: Allocator, config: SimConfig, step_time: StepTimeModel) -> TieredCache | None:
        """The tiers ``config`` asks for under ``allocator``'s pool; None without them, or without blocks unless
        v0 swaps into the host tier. (The one place that reads a ``SimConfig``: it hands each concern out.)"""
        if not config.tiers.has_tiers:
            return None
        if isinstance(allocator, PagedAllocator):
            pool: BlockPool | None = allocator.manager.pool
        elif config.engine.preemption == "swap":
            pool = None
        else:
            return None
        return cls(config.tiers, config.block_size, config.kv_cache_groups, pool, step_time)

    def __init__(self, settings: TierSettings, block_size: int, groups: tuple[KVCacheGroup, ...],
                 pool: BlockPool | None, step_time: StepTimeModel) -> None:
        """Tiers as ``settings`` asks, copying blocks of ``block_size`` tokens of the KV cache ``groups``, under
        ``pool`` (None: the host tier is only v0's swap space).

        ``step_time`` is the model on its GPU: its prefills are what a load races (the load-or-recompute rule,
        layerwise loads); its model's KV sizes the copies and its GPU's links carry them, so the copies and the
        steps they overlap price one model on one GPU."""
        model, gpu, store = step_time.model, step_time.gpu, TIER_STORES[settings.tier_eviction]
        self.block_size = block_size
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self.bytes_per_block = block_size * model.kv_bytes_per_token
        # A pool that names its keys (group, hash) (``BlockPool.keys_by_group``): its blocks are one group's pages
        self.grouped = pool is not None and pool.keys_by_group
        if self.grouped:
            self.bytes_per_block = block_bytes(model, groups, block_size)
        self.full_ids = [g for g, group in enumerate(groups) if not group.is_sliding]
        self.sliding_ids = [g for g, group in enumerate(groups) if group.is_sliding]
        # vLLM's sliding_window_size_in_chunks: the blocks a sliding group's hit needs
        self.window_blocks = max((num_blocks_for(group.sliding_window or 0, block_size) for group in groups),
                                 default=0)
        self.write_through = settings.offload_policy == "write-through"
        self.exclusive = settings.tier_inclusion == "exclusive"
        self.layerwise = settings.layerwise_loads
        self.num_layers = model.num_layers
        self.step_time = step_time
        self.pool = pool
        host = gpu.host_link_bytes_per_s
        self.tiers = [Tier("cpu", store(settings.cpu_kv_blocks), Link(host), Link(host))]
        if settings.disk_kv_blocks:
            self.tiers.append(Tier("disk", store(settings.disk_kv_blocks), Link(gpu.disk_write_bytes_per_s),
                                   Link(gpu.disk_read_bytes_per_s)))
        # (hash, GPU block) to store at the step's end, as two lists: a replay names millions, and a pair each
        # is an allocation each
        self.pending_hashes: list[Hashable] = []
        self.pending_blocks: list[int] = []
        # Blocks holding output tokens (a request's keys past its full prompt blocks, named at its first admission),
        # never stored; forgotten when the GPU evicts them, as no request computes them again, or when the request
        # is done without the GPU caching them (``request_done``): at most the GPU's cached blocks and the running
        # requests' outputs, not a name per request of the trace.
        self.output_hashes: set[Hashable] = set()
        # The loads whose copies have not ended: (the host link's end of the copy, per tier the keys it reads),
        # in issue order, which is the order they end in (every load ends on the host link's one queue). Their
        # blocks are pinned in their tiers until then (``TierStore.pin``; ``end_loads``).
        self.loading: deque[tuple[float, list[list[Hashable]]]] = deque()
        if pool is not None:
            pool.events.subscribe(self)

    # -- the pool's reports ------------------------------------------------------------------------------------

    def cached(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """The GPU computed (or loaded) these blocks: write-through stores them after the step; exclusive tiers
        give them up (the GPU's copy is the block's one copy until the GPU evicts it)."""
        if not self.write_through:
            if self.exclusive:
                for tier in self.tiers:
                    tier.store.remove(block_hashes)
            return
        self._pend(block_hashes, blocks)

    def evicted(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """The GPU is about to overwrite these cached blocks: on-eviction stores the prompt blocks among them."""
        if not self.write_through:  # (write-through: nothing to store, only output blocks' names to forget)
            self._pend(block_hashes, blocks)
        self.output_hashes.difference_update(block_hashes)

    def _pend(self, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        """Gather the prompt blocks among these cached blocks for the step's stores (output blocks are never
        stored)."""
        if len(block_hashes) != len(blocks):
            raise ValueError(f"{len(block_hashes)} block hashes for {len(blocks)} blocks: the pool's report is torn")
        outputs = self.output_hashes
        if outputs.isdisjoint(block_hashes):  # (a prefill's blocks, the common call: no filter in Python)
            self.pending_hashes.extend(block_hashes)
            self.pending_blocks.extend(blocks)
        else:
            prompt = [block_hash not in outputs for block_hash in block_hashes]
            self.pending_hashes.extend(compress(block_hashes, prompt))
            self.pending_blocks.extend(compress(blocks, prompt))

    def host_holds(self, key: Hashable) -> bool:
        """Whether the host tier holds ``key`` (for a data plane that mirrors it: ``apps/offload_steps.py``)."""
        return self.tiers[0].store.contains(key)

    # -- swap (vLLM v0) -----------------------------------------------------------------------------------------

    def can_swap_out(self, num_slots: int) -> bool:
        """Whether the host tier has room for a request's ``num_slots`` slots of KV beside the swapped ones."""
        return self.tiers[0].store.can_reserve(num_blocks_for(num_slots, self.block_size))

    def swap_out(self, num_slots: int, earliest: float) -> float:
        """Copy a preempted request's ``num_slots`` slots of KV into the host tier, after ``earliest`` (the copies
        before it on the compute stream) and the write link's earlier copies; when it ends (precondition:
        ``can_swap_out``). Its blocks hold host-tier slots, evicting cached blocks, until ``swap_in``."""
        host = self.tiers[0]
        self.end_loads(earliest)
        host.store.reserve(num_blocks_for(num_slots, self.block_size))
        num_bytes = num_slots * self.kv_bytes_per_token
        host.swap_out_bytes += num_bytes
        return host.write.reserve(earliest, num_bytes)

    def swap_in(self, num_slots: int, num_moved: int, earliest: float) -> float:
        """A swapped-out request of ``num_slots`` slots comes back: ``num_moved`` of them cross the read link
        (the rest the GPU's prefix cache still held), after ``earliest``; when the copy ends. Its host-tier
        slots are free again."""
        self.release_swapped(num_slots)
        return self.tiers[0].read.reserve(earliest, num_moved * self.kv_bytes_per_token) if num_moved else earliest

    def release_swapped(self, num_slots: int) -> None:
        """Give back the host-tier slots of a swapped-out request (swapped in, or rejected)."""
        self.tiers[0].store.unreserve(num_blocks_for(num_slots, self.block_size))

    # -- the result --------------------------------------------------------------------------------------------

    def metrics(self, prompt_tokens: int, makespan_s: float) -> dict[str, TierMetrics]:
        """Per tier, over a replay whose first admissions looked up ``prompt_tokens`` and lasted ``makespan_s``."""
        return tier_metrics(self.tiers, self.bytes_per_block, prompt_tokens, makespan_s)

    def violations(self) -> list[str]:
        """The tiers' broken invariants (the module docstring's), each named."""
        on_gpu = self.pool.is_cached if self.exclusive and self.pool is not None else None
        return tier_violations(self.tiers, self.bytes_per_block, on_gpu)
