"""The block manager for KV cache groups (vLLM v1's hybrid KV cache manager: ``HybridKVCacheCoordinator`` over one
``SingleTypeKVCacheManager`` per group).

Over 300 lines: the manager and its batched decode (``decode_in_bulk``) change the same private state (tables, the
pool, the hit memo) and must keep the same invariants; split apart, each half would reach into the other's state.

One pool of blocks of one size serves every group (``kv_groups.py`` makes the pages equal); each sequence keeps
one block table per group, all of the same length, ``ceil(sequence_length / block_size)``. A full-attention group
holds every block until the sequence ends. A sliding-window group of window W lets go of the blocks its next
token can no longer see: before each allocation (vLLM's ``remove_skipped_blocks``, run from ``allocate_slots``),
with C tokens computed, the first ``max(0, C - W + 1) // block_size`` entries are freed, last first, and replaced
by ``NULL_BLOCK`` - vLLM's null block, a placeholder that keeps logical positions in place::

    block_size 4, W 8, C 14 (tokens 0..13 computed, token 14 next; it sees tokens 7..14)
    skipped = (14 - 8 + 1) // 4 = 1 block       full:    [ 5, 2, 9, 1]
                                                sliding: [ø, 3, 7, 4]   (block 0 held tokens 0..3: freed)

Prefix caching keys a block by (group, content hash): each group caches its own copy of a prefix. A new prompt's
hit is found as vLLM's hybrid coordinator finds it: full attention from the left (the longest run of cached
blocks, every full group hit), then, within that length, sliding window from the right (the last run of
``ceil((W - 1) / block_size)`` blocks cached in every sliding group; the blocks before it are not needed, so they
enter the table as null blocks); the full groups are cut back to the sliding groups' length. With no run that
long the hit is the run from the start. Freed blocks of every group go to the one free queue, so all groups share
one eviction order; a sequence frees group by group, each tail first (vLLM's coordinator ``free``).

Invariants (``hybrid_invariants.py`` checks them): ``KVBlockManager``'s over all groups' tables, and per group:
``ceil(length / block_size)`` entries; null blocks only in sliding groups, only as a prefix, never one the window
still reaches; a cached held block sits where its group's content has that hash, inside the computed tokens.
Every sliding group of a sequence has as many null entries, and every cached group as many blocks offered to the
cache (all slide and cache together): the fast paths count one group for all.

``grow`` first slides the windows (that happens even when the allocation then fails, as in vLLM, where it makes
room for the retry after a preemption); the allocation itself is all or nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from minipaged_cli.memory.block_pool import num_blocks_for
from minipaged_cli.memory.grouped_pool import GroupedBlockPool
from minipaged_cli.memory.hybrid_invariants import NULL_BLOCK, hybrid_manager_violations
from minipaged_cli.memory.kv_groups import KVCacheGroup, sliding_admission_blocks
from minipaged_cli.memory.sequence import DuplicateSequenceError, OutOfBlocksError, UnknownSequenceError

SequenceId = Hashable


def tail_first(table: list[int], start: int, stop: int) -> list[int]:
    """``table[start:stop]`` last entry first, in one slice: the order a window's slide and a release free a
    table's blocks in (vLLM frees tail first, so that a prefix's tail is evicted before its head)."""
    return table[stop - 1:start - 1 if start else None:-1] if stop > start else []


@dataclass
class GroupedSequence:
    """One live sequence under KV cache groups: ``block_tables[g]`` is group g's table (``NULL_BLOCK`` where a
    sliding window let go), ``num_null[g]`` its leading null entries, ``num_cached_blocks[g]`` the entries already
    offered to the prefix cache (vLLM's ``num_cached_block``; no entry past them carries a key),
    ``num_held_blocks`` the entries that are not null in all tables (kept as a count: the accounting asks for it
    per sequence and step)."""

    sequence_id: SequenceId
    sequence_length: int
    block_tables: list[list[int]]
    num_null: list[int]
    num_cached_blocks: list[int]
    block_hashes: list[Hashable] = field(default_factory=list, repr=False)
    num_cached_tokens: int = 0
    num_computed_tokens: int = 0
    # Tokens after the computed ones that a tier below the GPU loads (sim/tiers.py): their blocks are held, not
    # cached, and a sliding window already counts them (vLLM's num_external_computed_tokens)
    num_loading_tokens: int = 0
    num_held_blocks: int = 0


class HybridBlockManager:
    """Blocks for sequences under several KV cache groups from one pool (module docstring: the rules).

    ``max_in_flight_tokens`` (vLLM: ``max_num_batched_tokens``) and ``max_model_len`` cap what the admission gate
    counts for a sliding group (vLLM's ``SlidingWindowSpec.max_admission_blocks_per_request``); None: no cap.
    """

    def __init__(self, num_physical_blocks: int, block_size: int, groups: Sequence[KVCacheGroup], *,
                 enable_prefix_caching: bool = False, max_in_flight_tokens: int | None = None,
                 max_model_len: int | None = None) -> None:
        if num_physical_blocks < 1:
            raise ValueError(f"num_physical_blocks must be >= 1, got {num_physical_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not groups:
            raise ValueError("at least one KV cache group")
        self.num_physical_blocks = num_physical_blocks
        self.block_size = block_size
        self.groups = tuple(groups)
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = GroupedBlockPool(num_physical_blocks, len(self.groups), enable_caching=enable_prefix_caching)
        # (cache version, prompt hashes, {num_tokens: find_hits' answer})
        self._hits_memo: tuple[int, Sequence[Hashable], dict[int, tuple[list[list[int]], int]]] = (-1, (), {})
        self.sequences: dict[SequenceId, GroupedSequence] = {}
        self.full_ids = [g for g, group in enumerate(self.groups) if not group.is_sliding]
        self.sliding_ids = [g for g, group in enumerate(self.groups) if group.is_sliding]
        self._no_hits: list[list[int]] = [[] for _ in self.groups]  # (``find_hits``'s answer for a miss)
        self.group_slides = [group.is_sliding for group in self.groups]
        windows = {self.groups[g].sliding_window for g in self.sliding_ids}
        if len(windows) > 1 or None in windows:
            raise ValueError(f"sliding groups need one window, got {sorted(windows, key=str)}")
        self.window = windows.pop() if windows else None
        # A hit needs the last ceil((W - 1) / block_size) blocks of a sliding group; with W = 1 that is none, and
        # vLLM's cache_blocks then caches no block of the group (its reachable_block_mask keeps none).
        self.hit_run = num_blocks_for(self.window - 1, block_size) if self.window else 0
        self.cached_group_ids = [g for g in range(len(self.groups)) if g in self.full_ids or self.hit_run]
        self.admission_cap = None  # most blocks a sliding group counts at the admission gate
        if self.window is not None and max_in_flight_tokens is not None and max_model_len is not None:
            self.admission_cap = sliding_admission_blocks(self.window, block_size, max_in_flight_tokens,
                                                          max_model_len)

    # -- queries -------------------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.pool.free_blocks.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_physical_blocks - self.pool.free_blocks.num_free

    @property
    def num_shared_references(self) -> int:
        return self.pool.num_shared_references

    def sequence(self, sequence_id: SequenceId) -> GroupedSequence:
        try:
            return self.sequences[sequence_id]
        except KeyError:
            raise UnknownSequenceError(f"unknown sequence {sequence_id!r}") from None

    def num_held_blocks(self, sequence_id: SequenceId) -> int:
        """Blocks the sequence holds over all groups (null entries cost nothing)."""
        return self.sequences[sequence_id].num_held_blocks

    def num_held_tokens(self, sequence_id: SequenceId, num_tokens: int) -> int:
        """Of the sequence's first ``num_tokens``, the K/V entries its groups hold: a token counts once per
        group whose table still has its block."""
        if not self.sliding_ids:
            return len(self.groups) * num_tokens
        num_null = self.sequences[sequence_id].num_null[self.sliding_ids[0]]  # (the same in every sliding group)
        return (len(self.groups) - len(self.sliding_ids)) * num_tokens + \
            len(self.sliding_ids) * max(0, num_tokens - num_null * self.block_size)

    def skipped_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks a sliding group no longer needs once ``num_computed_tokens`` are computed: the next
        token sees only the last W - 1 of them (vLLM's ``get_num_skipped_tokens`` // block_size)."""
        return max(0, num_computed_tokens - self.window + 1) // self.block_size if self.window else 0

    def blocks_needed(self, sequence_id: SequenceId | None, num_tokens: int,
                      block_hashes: Sequence[Hashable] = ()) -> int:
        """Blocks the free queue must give to append ``num_tokens`` to the sequence (after its windows slide),
        or (None) the admission gate's count for a prompt of ``num_tokens`` (vLLM's ``full_sequence_must_fit``:
        hits on free cached blocks count, a sliding group at most ``admission_cap``)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if sequence_id is None:
            hits, hit_tokens = self.find_hits(block_hashes, num_tokens)
            return self.blocks_to_allocate(hits, hit_tokens, num_tokens, self.admission_cap)
        state = self.sequence(sequence_id)
        per_group = num_blocks_for(state.sequence_length + num_tokens, self.block_size) - len(state.block_tables[0])
        return per_group * len(self.groups)

    def blocks_to_create(self, num_tokens: int, block_hashes: Sequence[Hashable] = ()) -> int:
        """Blocks the free queue must give to create a sequence of ``num_tokens`` now (no cap: what
        ``create_sequence`` takes)."""
        hits, hit_tokens = self.find_hits(block_hashes, num_tokens)
        return self.blocks_to_allocate(hits, hit_tokens, num_tokens, None)

    def num_cached_tokens(self, num_tokens: int, block_hashes: Sequence[Hashable]) -> int:
        return self.find_hits(block_hashes, num_tokens)[1]

    # -- lifecycle -----------------------------------------------------------------------------------------

    def create_sequence(self, sequence_id: SequenceId, num_prompt_tokens: int = 0, *,
                        block_hashes: Sequence[Hashable] = (),
                        num_computed_tokens: int | None = None) -> GroupedSequence:
        """Start a sequence holding a prompt of ``num_prompt_tokens`` (all of its blocks in every group, or
        none), sharing the hybrid prefix hit; ``num_computed_tokens`` as ``KVBlockManager.create_sequence``."""
        if sequence_id in self.sequences:
            raise DuplicateSequenceError(f"sequence {sequence_id!r} already exists")
        if num_computed_tokens is None:
            num_computed_tokens = num_prompt_tokens
        elif not 0 <= num_computed_tokens <= num_prompt_tokens:
            raise ValueError(f"num_computed_tokens must be in [0, {num_prompt_tokens}], got {num_computed_tokens}")
        hits, hit_tokens = self.find_hits(block_hashes, num_prompt_tokens)
        needed = self.blocks_to_allocate(hits, hit_tokens, num_prompt_tokens, None)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(f"a prompt of {num_prompt_tokens} tokens for sequence {sequence_id!r} needs "
                                   f"{needed} new blocks, {self.num_free_blocks} free")
        skipped = self.skipped_blocks(hit_tokens)
        tables, nulls = [], []
        for g, group_hits in enumerate(hits):
            num_null = skipped if self.groups[g].is_sliding else 0
            kept = group_hits[num_null:]
            for block in kept:
                self.pool.reference(block)
            tables.append([NULL_BLOCK] * num_null + kept)
            nulls.append(num_null)
        state = GroupedSequence(sequence_id, hit_tokens, tables, nulls, [len(t) for t in tables],
                                list(block_hashes), hit_tokens, hit_tokens,
                                num_held_blocks=sum(len(t) for t in tables) - sum(nulls))
        self.sequences[sequence_id] = state
        self._take(state, num_prompt_tokens)
        self._computed(state, num_computed_tokens)
        return state

    def grow(self, sequence_id: SequenceId, num_tokens: int, *, computed: bool = True) -> GroupedSequence:
        """Slide the windows, then give the next ``num_tokens`` tokens their slots in every group (all or
        nothing); ``computed`` as in ``KVBlockManager.grow``."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        state = self.sequence(sequence_id)
        block_size = self.block_size
        # (The calls only where something happens: most decode steps slide no window and take no block. The
        # window slides once (C - W + 1) // B, the skipped blocks, passes the null entries.)
        if (self.window is not None and state.num_computed_tokens - self.window
                >= (state.num_null[self.sliding_ids[0]] + 1) * block_size - 1):
            self._slide(state, state.num_computed_tokens)
        new_length = state.sequence_length + num_tokens
        if new_length > len(state.block_tables[0]) * block_size:
            self._take(state, new_length)
        else:
            state.sequence_length = new_length
        if computed:
            self._computed(state, new_length)
        return state

    def slide_window(self, sequence_id: SequenceId, num_computed_tokens: int | None = None) -> None:
        """Free the sliding groups' blocks that the window no longer reaches with ``num_computed_tokens``
        (default: the sequence's) computed, each group's last first (vLLM's ``_remove_blocks_in_range``)."""
        state = self.sequences[sequence_id]
        if self.window is not None:
            self._slide(state, state.num_computed_tokens if num_computed_tokens is None else num_computed_tokens)

    def _slide(self, state: GroupedSequence, num_computed_tokens: int) -> None:
        skipped = min(self.skipped_blocks(num_computed_tokens), len(state.block_tables[0]))
        sliding = self.sliding_ids[0]  # (the counts are the same in every sliding group)
        if skipped > state.num_null[sliding]:  # (one call: group by group, as one call each)
            if skipped <= state.num_cached_blocks[sliding]:  # every block freed carries a key
                self.pool.release_split(self._null_out(state, skipped), ())
            else:
                self.pool.release(*self._null_out(state, skipped))

    def _null_out(self, state: GroupedSequence, skipped: int) -> list[list[int]]:
        """Replace the sliding groups' blocks before ``skipped`` with null blocks; the blocks they held, per group,
        each group's last first (for the pool to release)."""
        first = state.num_null[self.sliding_ids[0]]
        nulls = [NULL_BLOCK] * (skipped - first)
        parts = []
        for g in self.sliding_ids:
            table = state.block_tables[g]
            parts.append(tail_first(table, first, skipped))
            table[first:skipped] = nulls
            state.num_null[g] = skipped
        state.num_held_blocks -= len(nulls) * len(parts)
        return parts

    def decode_in_bulk(self, sequence_ids: Sequence[SequenceId], num_steps: int) -> bool:
        """``num_steps`` decode steps (one computed token each) of every sequence at once, leaving the pool as
        the steps one at a time leave it, where that does not depend on how their takes and frees interleave:
        every block a window frees carries a hash (prefix caching: it joins the back of the free queue) and the
        steps take at most the blocks free now, so the takes are the queue's first blocks in step order, never
        a block freed meanwhile, and the frees join the back in step order. False, nothing changed, otherwise
        (the caller steps in lockstep). Takes then caching then frees: a block is cached before it is freed, as
        one step at a time caches a block once full, W - 1 tokens before its window lets go of it. Not while
        anyone subscribes to the pool's events (the tiers want the caching order of single steps)."""
        pool, block_size, window = self.pool, self.block_size, self.window
        if window is None or not self.enable_prefix_caching or not self.hit_run or pool.events.has_subscribers:
            return False
        # With hit_run > 0 every group is cached (``cached_group_ids``), so a sequence's ``num_cached_blocks`` is
        # one number for all groups, and its sliding groups' null entries move together: one stands for each.
        sliding, group_slides = self.sliding_ids[0], self.group_slides
        states = [self.sequences[sequence_id] for sequence_id in sequence_ids]
        takes, slides = [], []  # (step, position in the running order[, blocks skipped then])
        caching = []  # (sequence, first sliding, first, stop) each
        full_keys: list[Hashable] = []  # the keys a full group caches, in caching order; and a sliding group
        sliding_keys: list[Hashable] = []
        take, slide = takes.append, slides.append
        limit = num_steps + 1
        for order, state in enumerate(states):
            length = state.sequence_length
            final = length + num_steps
            num_null, num_cached = state.num_null[sliding], state.num_cached_blocks[0]
            # Most sequences take, fill and let go of no block in a bulk's few steps: no take (no L + j - 1 = 0
            # mod B for j <= k), no block filled past the cached ones, and no slide (the last step's skip, the
            # largest, none new). Tested first: such a sequence frees nothing, so its hashes need no look.
            if ((length - 1) % block_size + num_steps < block_size and final // block_size <= num_cached
                    and (final - window) // block_size <= num_null):
                continue
            hashes = state.block_hashes
            num_hashes = len(hashes)
            if final - window >= block_size * (num_hashes + 1):
                return False  # a block past the hashes is never cached: freed, it would go to the front
            stop = final // block_size
            if stop > num_hashes:
                stop = num_hashes
            # Step j takes a block when L + j - 1 = 0 mod B; with L + j - 1 computed (step 1: the sequence's
            # computed tokens, the slide a just-finished prefill left) it skips max(0, L + j - W) // B blocks, one
            # more when L + j - W = 0 mod B. (Builtins and bound methods kept out of this loop: it runs per
            # sequence and bulk step.)
            for step in range((1 - length) % block_size or block_size, limit, block_size):
                take((step, order))
            skipped = (state.num_computed_tokens + 1 - window) // block_size  # (negative: none, as 0)
            if skipped > num_null:
                slide((1, order, skipped))
            if final > window:
                for step in range((window - length) % block_size or block_size, limit, block_size):
                    if step > 1 and length + step > window:
                        slide((step, order, (length + step - window) // block_size))
            if stop > num_cached:  # (null entries, a prefix of a sliding group, are never cached)
                first_sliding = num_null if num_null > num_cached else num_cached
                caching.append((state, first_sliding, num_cached, stop))
                full_keys += hashes[num_cached:stop]
                sliding_keys += hashes[first_sliding:stop]
        num_taken = len(takes) * len(self.groups)
        if num_taken > pool.free_blocks.num_free:
            return False
        # Content cached already, or twice, would make the cached copy depend on the order of caching and
        # evictions (a sequence recomputing its own blocks): then lockstep.
        group_keys = [sliding_keys if slides_g else full_keys for slides_g in group_slides]
        # (A sliding group's keys are some of the full groups', in the same order: distinct when those are.)
        if len(set(full_keys)) != len(full_keys) or not all(
                cached.keys().isdisjoint(keys) for cached, keys in zip(pool.cached_blocks, group_keys, strict=True)):
            return False
        if takes:
            taken: list[int] = []
            pool.take(num_taken, taken)
            takes.sort()
            next_taken = iter(taken).__next__
            num_groups = len(self.groups)
            for _, order in takes:
                state = states[order]
                for table in state.block_tables:  # group by group, as ``_take``
                    table.append(next_taken())
                state.num_held_blocks += num_groups
        if caching:  # (one call a group, its blocks in the order the calls one by one would cache them)
            group_blocks: list[list[int]] = [[] for _ in group_slides]
            for state, first_sliding, num_cached, stop in caching:
                for blocks, table, slides_g in zip(group_blocks, state.block_tables, group_slides, strict=True):
                    blocks += table[first_sliding if slides_g else num_cached:stop]
                state.num_cached_blocks = [stop] * len(group_slides)  # (offered to the cache, as ``_computed`` counts)
            for g, (keys, blocks) in enumerate(zip(group_keys, group_blocks, strict=True)):
                # (checked above: fresh content; blocks past the cached ones carry no hash)
                pool.cache_fresh_group(g, keys, blocks)
        for state in states:
            state.sequence_length = state.num_computed_tokens = state.sequence_length + num_steps
        if not slides:
            return True
        freed: list[list[int]] = []  # each slide's blocks, each group's last first (``slide_window``)
        blocks = []  # all of them, in that order
        slides.sort()
        for _, order, skipped in slides:
            state = states[order]
            if skipped > state.num_null[sliding]:
                parts = self._null_out(state, skipped)
                freed += parts
                blocks += itertools.chain.from_iterable(parts)
        if len(set(blocks)) == len(blocks):  # (all to the back, in order: one call frees as the calls one by one)
            pool.release_split([blocks], ())
        else:  # a block that two sequences share: the later release frees it
            for part in freed:
                pool.release(part)
        return True

    def mark_computed(self, sequence_id: SequenceId, num_computed_tokens: int) -> None:
        state = self.sequence(sequence_id)
        if not 0 <= num_computed_tokens <= state.sequence_length:
            raise ValueError(f"num_computed_tokens must be in [0, {state.sequence_length}] for sequence "
                             f"{sequence_id!r}, got {num_computed_tokens}")
        self._computed(state, num_computed_tokens)

    def release_sequence(self, sequence_id: SequenceId) -> None:
        """Drop the sequence's blocks group by group, each table tail first (vLLM's coordinator ``free``)."""
        state = self.sequence(sequence_id)
        keyed, keyless = [], []  # each table's blocks offered to the cache, and those after (keyless, its own)
        for table, nulls, num_cached in zip(state.block_tables, state.num_null, state.num_cached_blocks, strict=True):
            split = max(nulls, num_cached)
            keyed.append(tail_first(table, nulls, split))
            keyless.append(tail_first(table, split, len(table)))
        self.pool.release_split(keyed, keyless)  # (one call: group by group, as one call each)
        del self.sequences[sequence_id]

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """No copy-on-write here: vLLM v1 runs parallel samples as separate requests, never forks."""
        return []

    num_copy_on_writes = 0

    # -- invariants ----------------------------------------------------------------------------------------

    def invariant_violations(self) -> list[str]:
        """Every broken invariant, each as a sentence naming the bug it points to; empty when all hold."""
        return hybrid_manager_violations(self)

    # -- internals -----------------------------------------------------------------------------------------

    def find_hits(self, block_hashes: Sequence[Hashable], num_tokens: int) -> tuple[list[list[int]], int]:
        """Per group, the blocks a prompt of ``num_tokens`` would share (``NULL_BLOCK`` where a sliding group
        needs none), and the hit's length in tokens: vLLM's ``HybridKVCacheCoordinator.find_longest_cache_hit``
        for full attention plus one window (one pass suffices, as vLLM's "simple hybrid")."""
        # The scheduler asks about the same waiting prompt several times a step (its gate, its first chunk); the
        # answer changes only with the cache map. (The lists returned are shared: callers only read them.) Most
        # prompts miss on their first block: a full group then hits nothing, and neither does the window.
        if self.full_ids and (num_tokens <= self.block_size or not block_hashes or not self.enable_prefix_caching
                              or block_hashes[0] not in self.pool.cached_blocks[self.full_ids[0]]):
            return self._no_hits, 0
        version = self.pool.cache_version
        memo = self._hits_memo
        if memo[0] != version or memo[1] != block_hashes:
            memo = self._hits_memo = (version, list(block_hashes), {})  # (a copy: a list may grow)
        found = memo[2].get(num_tokens)
        if found is None:
            found = memo[2][num_tokens] = self._search_hits(block_hashes, num_tokens)
        return found

    def _search_hits(self, block_hashes: Sequence[Hashable], num_tokens: int) -> tuple[list[list[int]], int]:
        hits: list[list[int]] = [[] for _ in self.groups]
        if not self.enable_prefix_caching or num_tokens == 0 or not block_hashes:
            return hits, 0
        gets = [cached.get for cached in self.pool.cached_blocks]
        candidates = block_hashes[:(num_tokens - 1) // self.block_size]  # the last token is always computed
        num_hit = len(candidates)
        if self.full_ids:
            num_hit = 0
            for block_hash in candidates:
                found = [gets[g](block_hash) for g in self.full_ids]
                if None in found:
                    break
                for g, block in zip(self.full_ids, found, strict=True):
                    hits[g].append(block)
                num_hit += 1
        if self.sliding_ids:
            run, matched = 0, False
            found_at: dict[int, list[int]] = {}
            for i in range(num_hit - 1, -1, -1):
                found = [gets[g](candidates[i]) for g in self.sliding_ids]
                if None in found:
                    run = 0
                    continue
                found_at[i] = found
                run += 1
                if run >= self.hit_run:
                    num_hit, matched = i + run, True
                    break
            if not matched:
                num_hit = run
            for k, g in enumerate(self.sliding_ids):
                hits[g] = [found_at[i][k] if i in found_at else NULL_BLOCK for i in range(num_hit)]
            for g in self.full_ids:
                del hits[g][num_hit:]
        return hits, num_hit * self.block_size

    def blocks_to_allocate(self, hits: list[list[int]], hit_tokens: int, num_tokens: int,
                            cap: int | None) -> int:
        """Free-queue blocks a new sequence of ``num_tokens`` with these hits takes: vLLM's per-group
        ``get_num_blocks_to_allocate`` (new blocks past the hit or the skipped blocks, plus hits that revive a
        free cached block)."""
        required = num_blocks_for(num_tokens, self.block_size)
        if not hit_tokens:  # (no hit in any group: each takes its blocks, a sliding one at most ``cap``)
            return len(self.full_ids) * required + len(self.sliding_ids) * (required if cap is None
                                                                             else min(required, cap))
        skipped = self.skipped_blocks(hit_tokens)
        refs = self.pool.ref_counts
        total = 0
        for g, group_hits in enumerate(hits):
            sliding = self.groups[g].is_sliding
            group_required = min(required, cap) if sliding and cap is not None else required
            group_skipped = skipped if sliding else 0
            total += max(group_required - max(group_skipped, len(group_hits)), 0)
            total += sum(1 for block in group_hits[group_skipped:] if block != NULL_BLOCK and not refs[block])
        return total

    def _take(self, state: GroupedSequence, new_length: int) -> None:
        """Extend every table to ``new_length`` tokens, group by group from the free queue; all or nothing."""
        per_group = num_blocks_for(new_length, self.block_size) - len(state.block_tables[0])
        if per_group > 0:
            needed = per_group * len(self.groups)
            if needed > self.num_free_blocks:
                raise OutOfBlocksError(f"{new_length - state.sequence_length} tokens for sequence "
                                       f"{state.sequence_id!r} need {needed} new blocks, {self.num_free_blocks} free")
            taken: list[int] = []
            self.pool.take(needed, taken)  # (one call: the blocks group by group, as one call per group takes them)
            for g, table in enumerate(state.block_tables):
                table += taken[g * per_group:(g + 1) * per_group]
            state.num_held_blocks += needed
        state.sequence_length = max(state.sequence_length, new_length)

    def _computed(self, state: GroupedSequence, num_computed_tokens: int) -> None:
        """Advance the computed tokens; each group caches its blocks that became full and computed in its own
        map, skipping null entries (vLLM's ``cache_full_blocks``), and counts them as offered to the
        cache."""
        if num_computed_tokens <= state.num_computed_tokens:
            return
        if state.num_loading_tokens:  # (a load's end computes them)
            state.num_loading_tokens = max(0, state.num_computed_tokens + state.num_loading_tokens
                                           - num_computed_tokens)
        state.num_computed_tokens = num_computed_tokens
        cached = state.num_cached_blocks
        stop = min(num_computed_tokens // self.block_size, len(state.block_hashes))
        if not self.enable_prefix_caching or stop <= min(cached):  # (most decode steps fill no block)
            return
        nulls = state.num_null
        ranges = [(g, max(cached[g], nulls[g])) for g in self.cached_group_ids]
        ranges = [(g, first) for g, first in ranges if stop > first]  # (null entries, a prefix, are never cached)
        hashes, tables = state.block_hashes, state.block_tables
        for g, first in ranges:
            self.pool.cache_fresh_group(g, hashes[first:stop], tables[g][first:stop])  # (past the cached: no key)
        for g in self.cached_group_ids:
            cached[g] = max(cached[g], stop)
