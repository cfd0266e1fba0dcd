"""The stores of the tiers below the GPU: what goes down, when, and when a store is dropped.

``write-through``: every full prompt block the GPU computes is copied to the host tier after the step that computed
it, and from there to the disk tier (vLLM's connector and LMCache store every one). ``on-eviction``: a block goes
one tier down when the tier above evicts it (HiCache's write-back, KVBM's G1 -> G2 -> G3). Only prompt blocks go
down, under either policy, as vLLM's connector by default (``offload_prompt_only``) and LMCache and Mooncake Store
unless told to save the decode cache; the GPU's prefix cache still keeps the output blocks.

A step's stores are one copy over the link, queued behind the copies before it (HiCache's write-back queues its
backups alike). A block being written holds a slot of its tier that eviction cannot take, so a step's copy is
dropped (counted) when it, the blocks still in flight at the step's end and the blocks loads are reading would not
fit in the tier beside its reserved slots: vLLM skips a store when the idle chunks cannot make room (an in-flight
chunk is not evictable) and HiCache's ``write_backup`` fails alike when the host pool cannot allocate. That is the
only backlog bound those systems have, so it is the rule, with no knob.

Stores take link time, not step time: HiCache's write-back makes the eviction wait for the copy and vLLM's scheduler
waits for a store whose GPU block is reallocated (``jobs_to_flush``); neither wait is charged here
(``Tier.store_wait_s`` adds up how long each store's copy took from its issue, the bound of what such waits could
cost).

vLLM: vllm/v1/kv_offload/cpu/manager.py::CPUOffloadingManager.prepare_store
vLLM: vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py::handle_preemptions
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from itertools import chain, compress, filterfalse
from operator import not_

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.sim.tier_report import Tier


class TierStores:
    """The stores of ``TieredCache`` (mixed into it): the blocks the pool's events gathered go down at a step's end.

    It reads the tiers' state that ``TieredCache`` keeps: the tiers, the policy, the pending (hash, GPU block)
    lists, the GPU pool, and ``end_loads`` (a load's pins end before anything is evicted)."""

    tiers: list[Tier]
    write_through: bool
    bytes_per_block: int
    pending_hashes: list[Hashable]
    pending_blocks: list[int]
    pool: BlockPool | None
    end_loads: Callable[[float], None]

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
        if pinned and in_flight:  # (a load may read a block whose store has not ended: sim/tiers.py)
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
