"""The loads from the tiers below the GPU: what a request finds there, and whether loading beats recomputing.

At admission, after the GPU's prefix-cache hit, the prompt's next full blocks are looked up block by block in the
host tier, then the disk tier, up to the first miss; the last prompt token is always computed. The run is loaded
when the load would finish sooner than the GPU would recompute those tokens (the step-time model's prefill of
them: Mooncake's rule, FAST'25 §4), else recomputed. A loading request holds its GPU blocks from admission and
computes nothing until the load is done (vLLM's WAITING_FOR_REMOTE_KVS; with ``layerwise_loads`` it starts as soon
as the layers still to come would arrive before its compute needs them); its blocks join the GPU's prefix cache
when loaded. Loads queue on the link; they are never dropped.

A load's blocks are pinned in their tier from its issue until its copy ends, as vLLM pins a chunk being read (its
``ref_cnt`` > 0: not evictable); eviction takes the policy's next block instead. A scheduling that runs nothing, its
requests all loading, still issues its copies then (``Replay._start_copies``: vLLM's worker starts the loads in a
step of no tokens), and so the stores of the blocks those loads' allocations evicted.

KV cache groups (a sliding-window model under the hybrid manager): vLLM 0.33.0's connector supports them
(``SupportsHMA``) and keys a block by (group, hash), as the GPU pool does, so each group's blocks are stored as the
pool caches them, one pool block (one group's pages) each. A lookup takes the full-attention groups from the GPU's
hit on, up to the first block some group misses; within that, the sliding groups' last run of
``ceil(W / block_size)`` blocks held in every sliding group (none that long: the run from the GPU's hit on), which
ends the hit. A load moves every full group's blocks of the hit and each sliding group's last ``ceil(W /
block_size)`` of them (the GPU's table holds nothing before: null blocks); a hit token counts in the lowest tier
holding its full groups' blocks.

vLLM: vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py::get_num_new_matched_tokens
vLLM: vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py::_lookup_complete_chunks
vLLM: vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py::_sliding_window_lookup
vLLM: vllm/v1/kv_offload/cpu/manager.py::CPUOffloadingManager.prepare_load
vLLM: vllm/v1/kv_offload/cpu/manager.py::CPUOffloadingManager.complete_load
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from itertools import filterfalse
from operator import or_

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.sim.tier_links import load_times
from minipaged_cli.sim.tier_report import Tier


def sliding_hit_end(held: Sequence[bool], window_blocks: int) -> int:
    """Where a sliding-window group's hit ends among blocks ``held`` or not below the GPU.

    After the last run of ``window_blocks`` held blocks, scanning from the end; with no run that long, after the
    run from the first block (0 when the first is not held): a window needs only its last blocks.

    vLLM: vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py::_sliding_window_lookup
    """
    run = 0
    for block in range(len(held) - 1, -1, -1):
        if not held[block]:
            run = 0
            continue
        run += 1
        if run == window_blocks:
            return block + run
    return run


class TierLoads:
    """The loads of ``TieredCache`` (mixed into it): lookups, the load-or-recompute rule, and the pins of the
    blocks a load reads.

    It reads the tiers' state that ``TieredCache`` keeps: the tiers, the pool's key shape (``grouped``, the
    groups' ids, ``window_blocks``), the loads in flight (``loading``) and the output blocks' names."""

    tiers: list[Tier]
    pool: BlockPool | None
    block_size: int
    bytes_per_block: int
    grouped: bool
    full_ids: list[int]
    sliding_ids: list[int]
    window_blocks: int
    layerwise: bool
    num_layers: int
    step_time: StepTimeModel
    output_hashes: set[Hashable]
    loading: deque[tuple[float, list[list[Hashable]]]]

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
        """``load_times`` over the tiers' read links (``sim/tier_links.py``)."""
        return load_times([tier.read for tier in self.tiers], counts, self.bytes_per_block, now, commit=commit)
