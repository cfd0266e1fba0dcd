"""The prefix cache's tiers below the GPU: host memory, and local disk under it, each a capacity and a link.

Over 300 lines: one class, ``TieredCache``, whose stores, loads and v0's swaps share the links' clocks and the
tiers' stores, and this docstring, which states what is modelled and where it differs from vLLM.

What it models, after vLLM 0.33.0's OffloadingConnector (``distributed/kv_transfer/kv_connector/v1/offloading``)
and the systems issue 24 names (LMCache, SGLang HiCache, Dynamo KVBM, Mooncake Store):

- **Stores.** ``write-through``: every full prompt block the GPU computes is copied to the host tier after the step that
  computed it (vLLM's connector and LMCache store every one), and from there to the disk tier; ``on-eviction``:
  a block goes one tier down when the tier above evicts it (HiCache's write-back, KVBM's G1 -> G2 -> G3). A
  step's stores are one copy over the link, queued behind the copies before it (vLLM's worker submits every store
  job to its transfer stream; HiCache's write-back queues its backups). A block being written holds a slot of its
  tier that eviction cannot take (vLLM's ``CPUOffloadingManager``: an in-flight chunk has ``ref_cnt`` -1, not
  evictable, so ``prepare_store`` returns None, the store skipped, when the idle chunks cannot make room; HiCache's
  ``write_backup`` fails alike when the host pool cannot allocate): a step's copy is dropped (counted) when it and
  the blocks still in flight at the step's end and the blocks loads are reading (below) would not fit in the tier
  beside its reserved slots. That is the only backlog bound those systems have, so it is the rule, with no knob.
  Stores take link time, not step time: HiCache's write-back makes the eviction wait for the copy and vLLM's
  scheduler waits for a store whose GPU block is reallocated (``jobs_to_flush``); neither wait is charged here
  (``Tier.store_wait_s`` adds up how long each store's copy took from its issue, the bound of what such waits could
  cost). Only prompt blocks go down, under either policy: vLLM's connector stores a request's full prompt blocks
  only by default (``offload_prompt_only``), as LMCache and Mooncake Store do unless told to save the decode cache;
  the GPU's prefix cache still keeps the output blocks.
- **Loads.** At admission, after the GPU's prefix-cache hit, the prompt's next full blocks are looked up block by
  block in the host tier, then the disk tier, up to the first miss (``get_num_new_matched_tokens``); the last
  prompt token is always computed. The run is loaded when the load would finish sooner than the GPU would
  recompute those tokens (the step-time model's prefill of them: Mooncake's rule, FAST'25 §4), else recomputed.
  A loading request holds its GPU blocks from admission and computes nothing until the load is done (vLLM's
  WAITING_FOR_REMOTE_KVS; with ``layerwise_loads`` it starts as soon as the layers still to come would arrive
  before its compute needs them); its blocks join the GPU's prefix cache when loaded. Loads queue on the link
  (a disk load crosses the disk's read link, then the host link); they are never dropped. A load's blocks are
  pinned in their tier from its issue until its copy ends (vLLM's ``prepare_load``/``complete_load``: a chunk being
  read has ``ref_cnt`` > 0, not evictable); eviction takes the policy's next block instead. A scheduling that runs
  nothing, its requests all loading, still issues its copies then (``Replay._start_copies``: vLLM's worker starts
  the loads in a step of no tokens), and so the stores of the blocks those loads' allocations evicted.
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
- **KV cache groups** (a sliding-window model under the hybrid manager): vLLM 0.33.0's connector supports them
  (``SupportsHMA``) and keys a block by (group, hash), as the GPU pool does, so each group's blocks are stored as
  the pool caches them, one pool block (one group's pages) each. A lookup goes as vLLM's ``_lookup_complete_chunks``
  does: the full-attention groups from the GPU's hit on, up to the first block some group misses; within that, the
  sliding groups' last run of ``ceil(W / block_size)`` blocks held in every sliding group (none that long: the run
  from the GPU's hit on), which ends the hit. A load moves every full group's blocks of the hit and each sliding
  group's last ``ceil(W / block_size)`` of them (the GPU's table holds nothing before: null blocks); a hit token
  counts in the lowest tier holding its full groups' blocks.
- **Swap (vLLM v0).** Under ``--scheduler v0`` the host tier is also the swap space (v0's ``--swap-space``): a
  swapped-out request's blocks take host-tier slots (``TierStore.reserve``: cached blocks are evicted for them,
  swapped blocks are never evicted) until it swaps back in. Its bytes cross the same host link as the stores and
  loads: v0's worker copies ``blocks_to_swap_in`` then ``blocks_to_swap_out`` (``CacheEngine.swap_in``/
  ``swap_out``, ``cudaMemcpyAsync`` on the compute stream) before the step's forward, so each copy waits for the
  link direction it uses and for the copies before it (here in the order the scheduler decides them: swap-outs,
  then each admission's swap-in or load), and the forward for the last of them (``swap_out``, ``swap_in``: the
  step's duration pays it). v0 had no asynchronous KV connector: a load from the host tier is
  issued the same way, in the step that admits the request, and the forward waits for it.

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
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import chain, compress, filterfalse
from operator import not_, or_
from typing import Any

from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.block_pool import BlockPool, num_blocks_for
from minipaged_cli.memory.kv_groups import block_bytes
from minipaged_cli.memory.paged import PagedAllocator
from minipaged_cli.memory.tier_store import TIER_STORES, TierStore
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.units import rounded


def sliding_hit_end(held: Sequence[bool], window_blocks: int) -> int:
    """Where a sliding-window group's hit ends among blocks ``held`` or not below the GPU (vLLM's
    ``_sliding_window_lookup``): after the last run of ``window_blocks`` held blocks, scanning from the end; with
    no run that long, after the run from the first block (0 when the first is not held)."""
    run = 0
    for block in range(len(held) - 1, -1, -1):
        if not held[block]:
            run = 0
            continue
        run += 1
        if run == window_blocks:
            return block + run
    return run


class Link:
    """One direction of a link: a clock of when it is next free, and the seconds it was busy."""

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self.busy_until = 0.0
        self.busy_s = 0.0
        self.num_bytes = 0

    def finish(self, earliest: float, num_bytes: int) -> float:
        """When a copy of ``num_bytes`` queued at ``earliest`` would end (nothing reserved)."""
        return max(earliest, self.busy_until) + num_bytes / self.bytes_per_s

    def reserve(self, earliest: float, num_bytes: int) -> float:
        """Queue a copy of ``num_bytes`` behind the ones before it, no earlier than ``earliest``; when it ends."""
        self.busy_until = self.finish(earliest, num_bytes)
        self.busy_s += num_bytes / self.bytes_per_s
        self.num_bytes += num_bytes
        return self.busy_until


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


class TieredCache:
    """The tiers under one GPU pool (``pool.listener``: the pool reports what it caches and evicts); without a
    pool (a contiguous strategy swapping under v0) the host tier is only the swap space."""

    @classmethod
    def under(cls, allocator: Allocator, config: SimConfig, step_time: StepTimeModel) -> TieredCache | None:
        """The tiers ``config`` asks for under ``allocator``'s pool; None without them, or without blocks unless
        v0 swaps into the host tier."""
        if not config.has_tiers:
            return None
        if isinstance(allocator, PagedAllocator):
            return cls(config, allocator.manager.pool, step_time)
        return cls(config, None, step_time) if config.preemption == "swap" else None

    def __init__(self, config: SimConfig, pool: BlockPool | None, step_time: StepTimeModel) -> None:
        gpu, store = config.gpu, TIER_STORES[config.tier_eviction]
        self.block_size = config.block_size
        self.kv_bytes_per_token = config.model.kv_bytes_per_token
        self.bytes_per_block = config.block_size * config.model.kv_bytes_per_token
        groups = config.kv_cache_groups
        # A pool that names its keys (group, hash) (``BlockPool.keys_by_group``): its blocks are one group's pages
        self.grouped = pool is not None and pool.keys_by_group
        if self.grouped:
            self.bytes_per_block = block_bytes(config.model, groups, config.block_size)
        self.full_ids = [g for g, group in enumerate(groups) if not group.is_sliding]
        self.sliding_ids = [g for g, group in enumerate(groups) if group.is_sliding]
        # vLLM's sliding_window_size_in_chunks: the blocks a sliding group's hit needs
        self.window_blocks = max((num_blocks_for(group.sliding_window or 0, config.block_size) for group in groups),
                                 default=0)
        self.write_through = config.offload_policy == "write-through"
        self.exclusive = config.tier_inclusion == "exclusive"
        self.layerwise = config.layerwise_loads
        self.num_layers = config.model.num_layers
        self.step_time = step_time
        self.pool = pool
        host = gpu.host_link_bytes_per_s
        self.tiers = [Tier("cpu", store(config.cpu_kv_blocks), Link(host), Link(host))]
        if config.disk_kv_blocks:
            self.tiers.append(Tier("disk", store(config.disk_kv_blocks), Link(gpu.disk_write_bytes_per_s),
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
            pool.listener = self

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

    # -- stores ------------------------------------------------------------------------------------------------

    def flush(self, now: float, *, pairs: bool = True) -> list[tuple[Hashable, int]]:
        """Issue the stores gathered since the last flush at ``now`` (a step's end); the (hash, GPU block) pairs
        copied to the host tier (for a data plane; without ``pairs``, [] whatever was copied: a replay without
        one need not build millions)."""
        self.end_loads(now)
        hashes, blocks = self.pending_hashes, self.pending_blocks
        if not hashes:
            return []
        self.pending_hashes, self.pending_blocks = [], []
        host = self.tiers[0]
        if not self.write_through:  # a block cached on the GPU again meanwhile needs no copy
            gone = list(map(not_, map(self.pool.is_cached, hashes)))
            if not all(gone):
                hashes, blocks = list(compress(hashes, gone)), list(compress(blocks, gone))
        stored = host.store.contains
        # (two requests may compute the same content in one step: one copy, of the last block named; the filters
        # run in C, over a replay's millions of blocks)
        block_of = dict(zip(hashes, blocks, strict=True))
        new = list(filterfalse(stored, block_of))
        if len(new) < len(hashes):  # stored again: recently used
            host.store.refresh(list(filter(stored, hashes)))
        host.store.keep(hashes)  # (under exclusive tiers a block leaving for the GPU that the GPU gave up stays)
        if not new or not self._copy(host, new, now):
            return []
        evicted = host.store.insert_new(new)
        if len(self.tiers) > 1:
            disk = self.tiers[1]
            going = new if self.write_through else evicted
            disk.store.keep(going)  # (a block leaving the disk for the GPU, back down: the disk keeps it)
            down = list(filterfalse(disk.store.contains, going))
            if down and self._copy(disk, down, now):
                disk.store.insert_new(down)
        return list(zip(new, map(block_of.__getitem__, new), strict=True)) if pairs else []

    def _copy(self, tier: Tier, blocks: list[Hashable], now: float) -> bool:
        """One store of ``blocks`` into ``tier`` at ``now``, queued on its write link; none (counted dropped)
        when those blocks, the ones whose copies have not ended by ``now`` and the ones loads in flight read
        exceed the tier's room (the module docstring's rule; a block being both written and read counted once)."""
        in_flight, pinned, num_blocks = tier.in_flight, tier.store.pinned, len(blocks)
        while in_flight and in_flight[0][0] <= now:  # (copies end in issue order: the link is one queue)
            tier.num_in_flight -= len(in_flight.popleft()[1])
        num_read = len(pinned)
        if pinned and in_flight:  # (a load may read a block whose store has not ended: the module docstring)
            num_read = len(pinned.keys() - set(chain.from_iterable(written for _, written in in_flight)))
        if tier.num_in_flight + num_read + num_blocks > tier.store.room:
            tier.dropped_blocks += num_blocks
            return False
        end = tier.write.reserve(now, num_blocks * self.bytes_per_block)
        in_flight.append((end, blocks))
        tier.num_in_flight += num_blocks
        tier.store_wait_s += end - now
        tier.stored_blocks += num_blocks
        return True

    # -- loads -------------------------------------------------------------------------------------------------

    def lookup(self, held: Sequence[Sequence[bool]], first: int, stop: int) -> list[Tier]:
        """The tier holding each block from ``first`` to ``stop``, up to the first block no tier holds, where
        ``held[i][block]`` says whether tier ``i`` holds it (``TierStore.hit`` answers it without asking the
        stores again)."""
        host = held[0]
        anywhere = host if len(held) == 1 else list(map(or_, host, held[1]))  # (the host tier, and the disk's)
        end = anywhere.index(False, first, stop) if False in anywhere[first:stop] else stop
        return [self.tiers[0] if in_host else self.tiers[1] for in_host in host[first:end]]

    def _tier_of(self, key: Hashable) -> Tier | None:
        """The highest tier holding ``key``, if any."""
        return next((t for t in self.tiers if t.store.contains(key)), None)

    def lookup_groups(self, block_hashes: Sequence[Hashable], first: int,
                      stop: int) -> tuple[list[Tier], list[Tier], list[Hashable]]:
        """With KV cache groups (the module docstring's rule): per hit block from ``first``, the tier its tokens
        count in; and every (group, block) the load moves, and its tier."""
        tier_of = self._tier_of
        full: list[list[Tier]] = []  # per block from first, the tier of each full group's copy
        for block_hash in block_hashes[first:stop]:
            found = [tier_of((g, block_hash)) for g in self.full_ids]
            if None in found:
                break
            full.append(found)  # type: ignore[arg-type]
        end = first + len(full)
        if self.sliding_ids:
            held = [all(tier_of((g, block_hashes[block])) for g in self.sliding_ids) for block in range(first, end)]
            end = first + sliding_hit_end(held, self.window_blocks)
        order = self.tiers.index
        counted = [max(found, key=order, default=self.tiers[0]) for found in full[:end - first]]
        moved = [tier for found in full[:end - first] for tier in found]
        keys = [(g, block_hash) for block_hash in block_hashes[first:end] for g in self.full_ids]
        sliding = [(g, block_hashes[block]) for block in range(max(first, end - self.window_blocks), end)
                   for g in self.sliding_ids]
        moved += map(tier_of, sliding)  # type: ignore[arg-type]
        return counted, moved, keys + sliding

    def load(self, block_hashes: Sequence[Hashable], num_cached: int, num_prompt: int, now: float,
             count_hits: bool) -> tuple[int, float]:
        """After a GPU hit of ``num_cached`` tokens, the prompt tokens to load from the tiers and when the request
        may start computing; (0, now) when nothing is found or recomputing is faster. ``count_hits``: the
        request's first admission (its prompt is a query). Every prompt block a tier holds counts as reused there,
        the GPU's hits too (vLLM offers a request's every block for storing again: those stored are reuses),
        the first block last, the most recent."""
        first, stop = num_cached // self.block_size, (num_prompt - 1) // self.block_size
        prompt = block_hashes[:num_prompt // self.block_size]
        # the blocks past the prompt hold output tokens: named at the first admission (a re-prefill's prompt holds
        # output tokens too)
        outputs = block_hashes[num_prompt // self.block_size:] if count_hits else ()
        if self.grouped:
            prompt, outputs = self._pool_keys(prompt), self._pool_keys(outputs)
            found, moved, keys = self.lookup_groups(block_hashes, first, stop)
            for tier in self.tiers:
                tier.store.hit(prompt[::-1])
        else:  # a hit reorders a store, and does not change what it holds: the lookup reads the hits' answers
            held = [tier.store.hit(prompt[::-1])[::-1] for tier in self.tiers]
            found = moved = self.lookup(held, first, stop)
            keys = block_hashes[first:first + len(found)]
        self.output_hashes.update(outputs)
        if not found:
            return 0, now
        counts = [moved.count(tier) for tier in self.tiers]  # (a tier equals only itself)
        hits = [count * self.block_size for count in counts] if moved is found else \
            [found.count(tier) * self.block_size for tier in self.tiers]
        tokens = len(found) * self.block_size
        start, done = self._load_times(counts, now, commit=False)
        if done - now >= self.recompute_seconds(num_cached, tokens):
            if count_hits:
                for tier, hit in zip(self.tiers, hits, strict=False):
                    tier.recomputed_tokens += hit
            return 0, now
        start, done = self._load_times(counts, now, commit=True)
        self._pin(moved, keys, done)
        for tier, count, hit in zip(self.tiers, counts, hits, strict=False):
            tier.loaded_blocks += count
            if count_hits:
                tier.hit_tokens += hit
        if self.layerwise:  # the first layer must arrive; after it, compute waits only for what it outruns
            done = max(start + (done - start) / self.num_layers,
                       done - self.recompute_seconds(num_cached + tokens, num_prompt - num_cached - tokens))
        return tokens, done

    def _pin(self, tiers: Sequence[Tier], keys: Sequence[Hashable], until: float) -> None:
        """A load reads ``keys[i]`` from ``tiers[i]`` until ``until``: they stay in their tiers until then."""
        if len(self.tiers) == 1:
            by_tier = [list(keys)]
        else:
            by_tier = [[key for key, found in zip(keys, tiers, strict=True) if found is tier] for tier in self.tiers]
        for tier, read in zip(self.tiers, by_tier, strict=True):
            tier.store.pin(read)
        self.loading.append((until, by_tier))

    def end_loads(self, now: float) -> None:
        """The loads whose copies have ended by ``now`` let their blocks go (called before anything is evicted:
        a step's stores, a swap-out)."""
        loading = self.loading
        while loading and loading[0][0] <= now:
            for tier, read in zip(self.tiers, loading.popleft()[1], strict=True):
                tier.store.unpin(read)

    def _pool_keys(self, block_hashes: Sequence[Hashable]) -> list[Hashable]:
        """The GPU pool's keys of ``block_hashes`` under the hybrid manager: (group, hash), each group's."""
        groups = range(len(self.full_ids) + len(self.sliding_ids))
        return [(g, block_hash) for block_hash in block_hashes for g in groups]

    def request_done(self, block_hashes: Sequence[Hashable], num_prompt: int) -> None:
        """A request of ``num_prompt`` prompt tokens is done (finished or rejected): its output blocks the GPU does
        not hold cached now are never cached (the last full block when the output ends it: no step computes the
        last token's K/V; a rejected request's blocks it never reached), so their names go."""
        outputs = block_hashes[num_prompt // self.block_size:]
        if self.grouped:
            outputs = self._pool_keys(outputs)
        self.output_hashes.difference_update(filterfalse(self.pool.is_cached, outputs))

    def recompute_seconds(self, context: int, tokens: int) -> float:
        """The GPU's time to prefill ``tokens`` after ``context`` cached ones, less what a step costs anyway
        (weights read, launches): Mooncake's side of the load-or-recompute comparison."""
        model = self.step_time
        busy = model.step_seconds(new_tokens=tokens, sequences=1, prefill_tokens=tokens,
                                  prefill_attended=tokens * context + tokens * (tokens + 1) / 2,
                                  prefill_context=context + tokens)
        return float(busy - model.step_seconds(new_tokens=0, sequences=0))

    def _load_times(self, counts: list[int], now: float, *, commit: bool) -> tuple[float, float]:
        """(first byte, last byte) of a load of ``counts[i]`` blocks from tier ``i``: host blocks over the host
        link, disk blocks over the disk's read link and then the host link. Without ``commit`` the links' clocks
        stay as they are (the load is only priced)."""
        links = [tier.read if commit else copy.copy(tier.read) for tier in self.tiers]
        size = self.bytes_per_block
        host = links[0]
        start = done = max(now, host.busy_until)
        if counts[0]:
            done = host.reserve(now, counts[0] * size)
        if len(counts) > 1 and counts[1]:
            if not counts[0]:
                start = max(now, links[1].busy_until)
            from_disk = links[1].reserve(now, counts[1] * size)
            done = host.reserve(from_disk, counts[1] * size)
        return start, done

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
        def pct(part: float, whole: float) -> float:
            return 100.0 * part / whole if whole else 0.0

        return {tier.name: TierMetrics(
            name=tier.name, capacity_blocks=tier.store.capacity, hit_tokens=tier.hit_tokens,
            hit_pct=pct(tier.hit_tokens, prompt_tokens), recomputed_tokens=tier.recomputed_tokens,
            stored_bytes=tier.stored_blocks * self.bytes_per_block,
            loaded_bytes=tier.loaded_blocks * self.bytes_per_block,
            dropped_stores=tier.dropped_blocks, store_wait_s=tier.store_wait_s,
            evictions=tier.store.num_evictions, write_busy_pct=pct(tier.write.busy_s, makespan_s),
            read_busy_pct=pct(tier.read.busy_s, makespan_s)) for tier in self.tiers}

    def violations(self) -> list[str]:
        found = [f"{tier.name}: {v}" for tier in self.tiers for v in tier.store.violations()]
        if self.exclusive and self.pool is not None:
            on_gpu, above = self.pool.is_cached, set()
            for tier in self.tiers:  # (a block leaving for the GPU is in both until its load's copy ends)
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
        for tier in self.tiers:
            if tier.write.num_bytes != tier.stored_blocks * self.bytes_per_block + tier.swap_out_bytes:
                found.append(f"{tier.name}: bytes written differ from blocks stored x bytes per block + bytes "
                             "swapped out")
        return found
