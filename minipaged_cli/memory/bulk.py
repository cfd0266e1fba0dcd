"""The fast paths of the paged strategy: many decode steps at once, each checked against the step-by-step path.

The replay's bulk decode (``sim/replay.py``) asks how allocation evolves over k decode steps of the running
requests (``*_profile``), then applies them (``advance_*``). The readable model takes one step at a time
(``KVBlockManager.grow``); these functions reach the same state faster, and the property tests
(``tests/memory/test_bulk_decode.py``, ``tests/memory/test_bulk.py``) drive both and compare every block, count
and cache entry.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from minipaged_cli.memory import pool_loops
from minipaged_cli.memory.allocators import BulkProfile, total_slots

if TYPE_CHECKING:
    from minipaged_cli.memory.block_manager import KVBlockManager



def full_attention_profile(block_size: int, num_free_blocks: int, lengths: np.ndarray,
                           allocated: np.ndarray | int, finals: np.ndarray, num_steps: int) -> BulkProfile:
    """``Allocator.bulk_profile`` of one full-attention group: the steps whose new blocks the free blocks cover.
    ``allocated``: each request's slots, or their sum (all it reads). Compiled where ``pool_loops`` builds (a bulk
    of a few steps spends more in NumPy's calls than in their arithmetic); ``python_full_attention_profile`` is
    its reference."""
    module = pool_loops.compiled()
    if module is None:
        return python_full_attention_profile(block_size, num_free_blocks, lengths, allocated, finals, num_steps)
    num_ok, per_step, internal = module.full_attention_profile(block_size, num_free_blocks, lengths, finals,
                                                               total_slots(allocated), num_steps)
    return BulkProfile(num_ok, np.frombuffer(per_step, dtype=np.int64), np.frombuffer(internal, dtype=np.int64))


def python_full_attention_profile(block_size: int, num_free_blocks: int, lengths: np.ndarray,
                                  allocated: np.ndarray | int, finals: np.ndarray, num_steps: int) -> BulkProfile:
    """``full_attention_profile`` in NumPy."""
    # [n, k] matrix of the slots each request holds during each step, ceil((L + j) / B) * B for j = 1..k; the
    # caller keeps n * k small. (Written in as few numpy calls as it takes: at a handful of running requests,
    # each call's fixed cost is the bulk of the time.)
    rounded_up = np.arange(block_size, num_steps + block_size, dtype=np.int64)  # j + B - 1
    allocated_matrix = (lengths[:, None] + rounded_up) // block_size * block_size
    allocated_per_step = np.add.reduce(allocated_matrix, axis=0)  # (``ndarray.sum`` goes through a Python wrapper)
    # Steps whose new blocks, (allocated_per_step - Σ allocated) // B, the free blocks cover.
    limit = total_slots(allocated) + block_size * (num_free_blocks + 1) - 1
    num_ok = int(allocated_per_step.searchsorted(limit, side="right"))
    past_final = allocated_matrix[:, :num_ok] - finals[:, None]
    internal = np.add.reduce(np.maximum(past_final, 0, out=past_final), axis=0)
    return BulkProfile(num_ok, allocated_per_step[:num_ok], internal)



def windowed_profile(manager: KVBlockManager, lengths: np.ndarray, allocated: np.ndarray | int, finals: np.ndarray,
                     num_steps: int) -> BulkProfile:
    """``Allocator.bulk_profile`` under KV cache groups: every group's entries, less a sliding group's null ones.
    ``allocated``: each request's slots, or their sum (all it reads)."""
    # During step j a request of length L_j = L + j (after the step's growth) holds ceil(L_j / B) entries per
    # group; a sliding group slid with L_j - 1 computed, so max(0, L_j - W) // B of them are null blocks. (As
    # few numpy calls as it takes: at a handful of running requests each call's fixed cost is most of the time.)
    block_size, window = manager.block_size, manager.window or 0
    groups, sliding = len(manager.groups), len(manager.sliding_ids)
    length_matrix = lengths[:, None] + np.arange(1, num_steps + 1, dtype=np.int64)  # [n, k]
    entry_slots = (length_matrix + (block_size - 1)) // block_size * block_size  # [n, k] a group's entries
    skipped = (length_matrix - window) // block_size
    np.maximum(skipped, 0, out=skipped)
    skipped_slots = sliding * block_size * np.add.reduce(skipped, axis=0)  # [k] the null entries' slots
    # (``np.add.reduce``: ``ndarray.sum`` goes through a Python wrapper)
    allocated_slots = groups * np.add.reduce(entry_slots, axis=0) - skipped_slots  # [k]
    # Safe to take in bulk while each step's new blocks fit before any of that step's windows slide; all of
    # them when the new entries of every step fit at once (what the windows free meanwhile only helps). A
    # request takes at most k // B + 1 entries per group: the exact count only where that many may not fit.
    num_ok = num_steps
    free = manager.num_free_blocks
    if groups * len(lengths) * (num_steps // block_size + 1) > free:
        entries_sum = np.add.reduce(entry_slots, axis=0) // block_size  # [k]
        entries_now = int(np.add.reduce((lengths + (block_size - 1)) // block_size))
        if groups * (int(entries_sum[-1]) - entries_now) > free:
            # [k] blocks taken minus freed by then
            net = (allocated_slots - total_slots(allocated)) // block_size
            new_entries = groups * np.diff(entries_sum, prepend=entries_now)
            fits = np.concatenate(([0], net[:-1])) + new_entries <= free
            num_ok = int(np.argmin(fits)) if not fits.all() else num_steps
    if num_ok < num_steps:
        length_matrix, entry_slots = length_matrix[:, :num_ok], entry_slots[:, :num_ok]
        skipped_slots, allocated_slots = skipped_slots[:num_ok], allocated_slots[:num_ok]
    internal = groups * np.add.reduce(np.maximum(entry_slots - finals[:, None], 0), axis=0)
    tokens = groups * np.add.reduce(length_matrix, axis=0) - skipped_slots
    return BulkProfile(num_ok, allocated_slots, internal, tokens)



def advance_windowed(manager: KVBlockManager, sequence_ids: list[Hashable], num_steps: int) -> None:
    """``Allocator.advance`` under a sliding window: ``decode_in_bulk`` where it applies, else the decode steps in
    lockstep where it matters, so that the pool's history (which blocks are taken, freed, evicted, in which order) is
    what single steps make: at a request's block events, in the running order - a window skip (caught up to L + j - 1,
    then ``slide_window`` as step j's grow slides; step 1 too, for the slide a just-finished prefill left) and a new
    block (``grow`` up to L + j). In between a request's length changes and its filled blocks are cached, nothing
    else."""
    block_size, window = manager.block_size, manager.window
    assert window is not None, "advance_windowed needs a sliding window: a full-attention model grows each request"
    if decode_in_bulk(manager, sequence_ids, num_steps):
        return
    events = []  # (step, position in the running order, sequence id, new block)
    for order, sequence_id in enumerate(sequence_ids):
        length = manager.sequences[sequence_id].sequence_length
        first_new = (1 - length) % block_size or block_size  # step j takes a block when L + j - 1 = 0 mod B
        first_skip = (window - length) % block_size or block_size  # and skips one when L + j - W = 0 mod B
        new = range(first_new, num_steps + 1, block_size)
        events += [(step, order, sequence_id, True) for step in new]
        events += [(step, order, sequence_id, False)
                   for step in {1, *range(first_skip, num_steps + 1, block_size)}]
    done = dict.fromkeys(sequence_ids, 0)
    for step, _, sequence_id, new_block in sorted(events, key=lambda e: (*e[:2], e[3])):
        if new_block:  # (after the same step's slide: a step slides, then takes)
            manager.grow(sequence_id, step - done[sequence_id])
            done[sequence_id] = step
            continue
        if step - 1 > done[sequence_id]:  # the blocks that filled meanwhile are cached before any is freed
            manager.grow(sequence_id, step - 1 - done[sequence_id])
            done[sequence_id] = step - 1
        manager.slide_window(sequence_id)
    for sequence_id, steps_done in done.items():
        if steps_done < num_steps:
            manager.grow(sequence_id, num_steps - steps_done)



def decode_in_bulk(manager: KVBlockManager, sequence_ids: Sequence[Hashable], num_steps: int) -> bool:
    """``num_steps`` decode steps (one computed token each) of every sequence at once, leaving the pool as
    the steps one at a time leave it, where that does not depend on how their takes and frees interleave:
    every block a window frees carries a hash (prefix caching: it joins the back of the free queue) and the
    steps take at most the blocks free now, so the takes are the queue's first blocks in step order, never
    a block freed meanwhile, and the frees join the back in step order. False, nothing changed, otherwise
    (the caller steps in lockstep). Takes then caching then frees: a block is cached before it is freed, as
    one step at a time caches a block once full, W - 1 tokens before its window lets go of it. Not with a
    subscriber to the pool's events (the tiers want the caching order of single steps)."""
    pool, block_size, window = manager.pool, manager.block_size, manager.window
    if window is None or not manager.enable_prefix_caching or not manager.hit_run or pool.events.has_subscribers \
            or manager.num_forks:
        return False
    # With hit_run > 0 every group is cached (``cached_group_ids``), so a sequence's ``num_cached_blocks`` is
    # one number for all groups, and its sliding groups' null entries move together: one stands for each.
    sliding, group_slides = manager.sliding_ids[0], [group.is_sliding for group in manager.groups]
    states = [manager.sequences[sequence_id] for sequence_id in sequence_ids]
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
    num_taken = len(takes) * len(manager.groups)
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
        num_groups = len(manager.groups)
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
            pool.cache_fresh(keys, blocks, g)
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
            parts = manager.sliding.null_out(state, skipped)
            freed += parts
            blocks += itertools.chain.from_iterable(parts)
    if len(set(blocks)) == len(blocks):  # (all to the back, in order: one call frees as the calls one by one)
        pool.release_split([blocks], ())
    else:  # a block that two sequences share: the later release frees it
        for part in freed:
            pool.release(part)
    return True
