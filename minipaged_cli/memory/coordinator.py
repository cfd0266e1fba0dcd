"""The coordinator of a model's KV cache groups: one single-type manager per attention type (``single_type.py``)
over the block manager's one pool, and what it answers for all groups together: which cached blocks a prompt
shares, how many blocks a new sequence takes, which blocks join each group's cache.

A hit is found as vLLM's hybrid coordinator finds it: full attention from the left (the longest run of cached
blocks, every full group hit), then, within that length, sliding window from the right; the full groups are cut
back to the sliding groups' length. A single-group model is a coordinator over one full-attention manager.

vLLM: v1/core/kv_cache_coordinator.py::HybridKVCacheCoordinator
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.kv_groups import KVCacheGroup, sliding_admission_blocks
from minipaged_cli.memory.sequence import SequenceState, num_blocks_for
from minipaged_cli.memory.single_type import FullAttentionManager, SlidingWindowManager, num_free, tail_first

SearchHits = Callable[[Sequence[Hashable], int], tuple[list[list[int]], int]]


class HitsMemo:
    """The fast path of ``find_hits``: ``search_hits``' answers for one prompt, valid while the pool's ``cache_version``
    stays and the prompt's keys that the searches read are the same (``tests/memory/test_bulk.py`` checks it against
    the search). The admission asks about the same waiting prompt several times a step (its gate, its first chunk),
    and the answer changes only with the cache.

    An answer depends on the prompt's length and on the keys its search read: under full attention those up to the
    first miss (tens of a prompt's hundreds), which the memo copies alone (a copy of all touched every key object,
    twice: its copy, its release); under a sliding window all of the candidates (``reads_all``), where it copies the
    prompt's keys once. It compares them by value (in C; the same prompt's keys compare as pointers).

    Under one full-attention group (``cached``: its map) an answer found at an older version is checked rather than
    searched again: it holds while each hit key's entry is still its block and the key past the hit still misses,
    which is what the search would read (a map lookup a key in C, where the search takes Python steps). A waiting
    head is asked at every step, and nearly every step caches or evicts a block somewhere.
    """

    def __init__(self, block_size: int, reads_all: bool, cached: dict[Hashable, int] | None = None) -> None:
        self.block_size = block_size
        self.reads_all = reads_all
        self.cached = cached
        self.num_keys = -1  # the prompt's number of keys
        self.keys_read: Sequence[Hashable] = ()  # a copy of its first keys, as many as any answer's search read
        # num_tokens -> search_hits' answer, and the cache version at which it was last known to hold
        self.answers: dict[int, tuple[tuple[list[list[int]], int], int]] = {}

    def get(self, version: int, block_hashes: Sequence[Hashable], num_tokens: int,
            search: SearchHits) -> tuple[list[list[int]], int]:
        if not self._reads_as_before(block_hashes):
            self.num_keys, self.answers = len(block_hashes), {}
            self.keys_read = block_hashes[:0]  # (of the prompt's type: a list and a tuple never compare equal)
        known = self.answers.get(num_tokens)
        if known is not None:
            found, checked = known
            if checked == version:
                return found
            if self.cached is not None and self._holds(self.cached, found[0][0], block_hashes, num_tokens):
                self.answers[num_tokens] = found, version
                return found
        found = search(block_hashes, num_tokens)
        self.answers[num_tokens] = found, version
        # (the walk from the left stops at the key past the hit)
        num_read = len(block_hashes) if self.reads_all else \
            min(max(num_tokens - 1, 0) // self.block_size, len(block_hashes), found[1] // self.block_size + 1)
        if num_read > len(self.keys_read):
            self.keys_read = block_hashes[:num_read]
        return found

    def _holds(self, cached: dict[Hashable, int], hits: list[int], block_hashes: Sequence[Hashable],
               num_tokens: int) -> bool:
        """Whether the walk from the left over ``block_hashes`` in the one group's map ``cached`` finds ``hits`` now:
        each of their keys' entries is still that block, and the key past them (where the walk may go on) misses."""
        num_hit = len(hits)
        if num_hit < min(max(num_tokens - 1, 0) // self.block_size, len(block_hashes)) and \
                block_hashes[num_hit] in cached:
            return False
        return [*map(cached.get, itertools.islice(block_hashes, num_hit))] == hits

    def _reads_as_before(self, block_hashes: Sequence[Hashable]) -> bool:
        """Whether ``block_hashes`` has the memoised prompt's length and the keys its searches read."""
        if len(block_hashes) != self.num_keys:
            return False
        num_read = len(self.keys_read)
        return (block_hashes if num_read == self.num_keys else block_hashes[:num_read]) == self.keys_read


class KVCacheCoordinator:
    """The single-type managers of ``groups`` (``full``, ``sliding``; None where the model has no such group). The
    ``KVBlockManager`` extends it: ``groups``, ``block_size`` and ``pool`` are the manager's.

    Every sliding group of a sequence has as many null entries, and every cached group as many blocks offered to
    the cache (all slide and cache together): one group's count stands for all. ``admission_cap``: the most blocks
    a sliding group counts at the admission gate (from vLLM's ``max_num_batched_tokens`` and ``max_model_len``;
    None: no cap).
    """

    groups: tuple[KVCacheGroup, ...]
    block_size: int
    enable_prefix_caching: bool
    pool: BlockPool
    num_forks: int  # (``fork.py``: after a fork, caching tests each block for a key)

    def __init__(self, max_in_flight_tokens: int | None = None, max_model_len: int | None = None) -> None:
        self.full_ids = [g for g, group in enumerate(self.groups) if not group.is_sliding]
        self.sliding_ids = [g for g, group in enumerate(self.groups) if group.is_sliding]
        windows = {self.groups[g].sliding_window for g in self.sliding_ids}
        if len(windows) > 1 or None in windows:
            raise ValueError(f"sliding groups need one window, got {sorted(windows, key=str)}")
        self.window: int | None = windows.pop() if windows else None
        self.full = FullAttentionManager(self.full_ids, self.block_size) if self.full_ids else None
        self.sliding = SlidingWindowManager(self.sliding_ids, self.block_size, self.window) \
            if self.window is not None else None
        self.managers = [manager for manager in (self.full, self.sliding) if manager is not None]
        self.hit_run = self.sliding.hit_run if self.sliding else 0
        self.cached_group_ids = [g for g in range(len(self.groups)) if g in self.full_ids or self.hit_run]
        self.admission_cap = None  # most blocks a sliding group counts at the admission gate
        if self.window is not None and max_in_flight_tokens is not None and max_model_len is not None:
            self.admission_cap = sliding_admission_blocks(self.window, self.block_size, max_in_flight_tokens,
                                                          max_model_len)
        self._no_hits: list[list[int]] = [[] for _ in self.groups]  # (``find_hits``'s answer for a miss)
        # (``_num_free_hits``: the hits last counted and the pool's counters then; the count)
        self._free_hits_stamp: tuple[list[int], int, int] = ([], -1, -1)
        self._num_free_hit_blocks = 0
        self._hits_memo = HitsMemo(self.block_size, reads_all=self.sliding is not None,
                                   cached=self.pool.cached_blocks[0] if len(self.groups) == 1 and self.full is not None
                                   else None)
        # The live single-table sequences whose table holds slots past their ``final_length`` (those in their last
        # block: a few of a step's running ones), kept as their blocks are taken (``take_computed``,
        # ``grow_together``) and released: the accounting's sum of those slots reads them alone.
        self.past_final: dict[Hashable, SequenceState] = {}

    def skipped_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks a sliding group no longer needs once ``num_computed_tokens`` are computed."""
        return self.sliding.num_skipped_blocks(num_computed_tokens) if self.sliding else 0

    def blocks_to_create(self, num_tokens: int, block_hashes: Sequence[Hashable] = ()) -> int:
        """Blocks the free queue must give to create a sequence of ``num_tokens`` now (no cap: what
        ``create_sequence`` takes)."""
        hits, hit_tokens = self.find_hits(block_hashes, num_tokens)
        return self.blocks_to_allocate(hits, hit_tokens, num_tokens, None)

    def num_cached_tokens(self, num_tokens: int, block_hashes: Sequence[Hashable]) -> int:
        """Prompt tokens a sequence created now would find in the prefix cache."""
        return self.find_hits(block_hashes, num_tokens)[1]

    def find_hits(self, block_hashes: Sequence[Hashable], num_tokens: int) -> tuple[list[list[int]], int]:
        """``search_hits`` through its fast path: most prompts miss on their first block, and admission asks
        about the same waiting prompt several times a step (``HitsMemo``; the lists returned are shared:
        callers only read them)."""
        if (not self.enable_prefix_caching or num_tokens <= self.block_size or not block_hashes or
                (self.full_ids and block_hashes[0] not in self.pool.cached_blocks[self.full_ids[0]])):
            return self._no_hits, 0
        return self._hits_memo.get(self.pool.cache_version, block_hashes, num_tokens, self.search_hits)

    def search_hits(self, block_hashes: Sequence[Hashable], num_tokens: int) -> tuple[list[list[int]], int]:
        """Per group, the blocks a prompt of ``num_tokens`` would share (``NULL_BLOCK`` where a sliding group
        needs none), and the hit's length in tokens: full attention from the left, then, within that length,
        sliding window from the right; the full groups are cut back to the sliding groups' length. At most
        ``(num_tokens - 1) // block_size`` blocks: the last token is always computed.

        vLLM: v1/core/kv_cache_coordinator.py::HybridKVCacheCoordinator.find_longest_cache_hit
        """
        if not self.enable_prefix_caching:
            return self._no_hits, 0
        num_candidates = max(num_tokens - 1, 0) // self.block_size
        hits: list[list[int]] = [[] for _ in self.groups]
        num_hit = min(num_candidates, len(block_hashes))
        if self.full is not None:
            # (An iterator: the walk from the left stops at the first miss, where a slice copied all the candidates.)
            found = self.full.find_longest_cache_hit(self.pool, itertools.islice(block_hashes, num_candidates))
            for g, group_hits in zip(self.full_ids, found, strict=True):
                hits[g] = group_hits
                num_hit = len(group_hits)
        if self.sliding is not None:
            sliding_hits = self.sliding.find_longest_cache_hit(self.pool, block_hashes[:num_hit])
            num_hit = len(sliding_hits[0])
            for g, group_hits in zip(self.sliding_ids, sliding_hits, strict=True):
                hits[g] = group_hits
            for g in self.full_ids:
                del hits[g][num_hit:]
        return hits, num_hit * self.block_size

    def blocks_to_allocate(self, hits: list[list[int]], hit_tokens: int, num_tokens: int, cap: int | None) -> int:
        """Free-queue blocks a new sequence of ``num_tokens`` with these hits takes, a sliding group counting at most
        ``cap``: the single-type managers' counts over their groups."""
        required = num_blocks_for(num_tokens, self.block_size)
        if self.sliding is None:  # (the usual question, asked at every admission check: one count)
            if not hit_tokens:
                return len(self.groups) * required
            if len(self.groups) == 1:  # (no null entry, no skipped block: ``num_blocks_to_allocate``'s count)
                return max(required - len(hits[0]), 0) + self._num_free_hits(hits[0])
        total = 0
        for manager in self.managers:
            group_required = manager.admission_blocks(required, cap)
            if not hit_tokens:  # (no hit in any group: each takes its blocks)
                total += len(manager.group_ids) * group_required
                continue
            skipped = manager.num_skipped_blocks(hit_tokens)
            total += sum(manager.num_blocks_to_allocate(hits[g], group_required, skipped, self.pool.ref_counts)
                         for g in manager.group_ids)
        return total

    def _num_free_hits(self, hits: list[int]) -> int:
        """``num_free(hits)``, kept while no block has become free or held since it was counted: a block is free
        exactly when its count is 0, and it enters the free queue only by a release (counted in ``num_frees``) and
        leaves it only by a take or a revival (each moves ``num_free``). (A waiting head is asked several times a
        step; nearly half of those asks find the pool's blocks as they were.)"""
        pool = self.pool
        stamp = (hits, pool.num_frees, pool.free_blocks.num_free)
        if stamp != self._free_hits_stamp:  # (a copy kept: the hits compare by value)
            self._free_hits_stamp = (list(hits), *stamp[1:])
            self._num_free_hit_blocks = num_free(hits, pool.ref_counts)
        return self._num_free_hit_blocks

    def only_offered_blocks_keyed(self) -> bool:
        """Whether a sequence's blocks that carry a key are exactly those it offered to the cache (the first
        ``num_cached_blocks``), so that a release need test none: with one full-attention group and no fork (a
        fork shares blocks past those, which the other holder may cache; the checker's "cached past the blocks
        offered")."""
        return len(self.groups) == 1 and self.window is None and not self.num_forks

    def release_tables(self, state: SequenceState) -> None:
        """Drop the sequence's reference to each of its blocks, group by group, each table tail first (vLLM's
        ``free``, so a chain is evicted from its end); a block no one else holds returns to the free queue."""
        if self.only_offered_blocks_keyed():  # (the pool tests no block for a key: one compiled call, or the split)
            table, num_keyed = state.block_tables[0], state.num_cached_blocks[0]
            if not self.pool.loops.release_into(self.pool, table, num_keyed):
                self.pool.release_split([tail_first(table, 0, num_keyed)], [tail_first(table, num_keyed, len(table))])
        else:
            self.pool.release(*[tail_first(table, nulls, len(table))
                                for table, nulls in zip(state.block_tables, state.num_null, strict=True)])
        self.past_final.pop(state.sequence_id, None)

    def name_private(self, state: SequenceState, block_hashes: list[Hashable]) -> None:
        """The sequence's offered blocks that carry ``pool_loops.PRIVATE`` take their keys from ``block_hashes``,
        its own in full, which it carries from now on (one full-attention group)."""
        state.block_hashes = block_hashes
        offered = state.num_cached_blocks[0]
        self.pool.name_private(block_hashes[:offered], state.block_tables[0][:offered])

    def cache_full_blocks(self, state: SequenceState) -> None:
        """Each cached group offers its blocks that are full, computed and not yet offered to its own map,
        skipping null entries, and counts them as offered.

        vLLM: v1/core/block_pool.py::BlockPool.cache_full_blocks
        """
        cached = state.num_cached_blocks
        stop = min(state.num_computed_tokens // self.block_size, len(state.block_hashes))
        # A fork shares blocks past a table's offered ones, which the other holder may cache first: after one,
        # each block is tested for a key (``cache``); before, none carries one (``cache_fresh``).
        cache = self.pool.cache if self.num_forks else self.pool.cache_fresh
        hashes, tables, nulls = state.block_hashes, state.block_tables, state.num_null
        for g in self.cached_group_ids:
            first = max(cached[g], nulls[g])  # (null entries, a prefix, are never cached)
            if stop > first:
                cache(hashes[first:stop], tables[g][first:stop], g)
            if stop > cached[g]:
                cached[g] = stop
