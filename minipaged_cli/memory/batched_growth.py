"""A step's running sequences grown in one call: the paged strategy's fast path for the decodes of a step (and the
full-attention bulk advance), checked against ``KVBlockManager.grow`` one sequence at a time.

The readable model grows each running request through ``grow`` (``Allocator.try_grow``); most of those calls change
nothing but two lengths (a block boundary comes once every ``block_size`` tokens). ``grow_computed`` reaches the
state those calls reach, in order, with the same point of failure; the property tests
(``tests/memory/test_grow_computed.py``, ``tests/sim/test_batched_growth.py``) drive both and compare every block,
count, cache entry and figure.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from minipaged_cli.memory import pool_loops
from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.sequence import OutOfBlocksError

if TYPE_CHECKING:
    from minipaged_cli.memory.block_manager import KVBlockManager


def grow_computed(manager: KVBlockManager, sequences: Sequence[Hashable | Holding], num_tokens: int) -> int:
    """``manager.grow(sequence_id, num_tokens)`` for each sequence in order, stopping at the first the free blocks
    cannot serve (``OutOfBlocksError``: it and the rest unchanged); returns how many grew. ``sequences``: their ids,
    or the holdings allocated under them (the compiled pass reads a holding's id itself: a step's decodes are a
    list of holdings, and a list of their ids cost a pass in Python).

    ``grow_together`` where it is exact (compiled where the pool is in its usual case: ``pool_loops.grow_batch``),
    else one at a time: a sequence whose growth takes no block, copies no shared block, fills no block the prefix
    cache wants and has every token computed only has its lengths moved, without ``grow``'s calls (most decode
    steps are that: a block boundary comes once every ``block_size`` tokens); any other, and every sequence under a
    sliding window, goes through ``grow``."""
    grown = manager.pool.loops.grow_batch(manager, sequences, num_tokens)  # (grow_together, compiled)
    if grown is not None and grown is not False:
        return grown
    sequence_ids = [s.sequence_id if isinstance(s, Holding) else s for s in sequences]
    if grown is False:
        grown = grow_together(manager, sequence_ids, num_tokens)
    if grown is not None:
        return grown
    sequences, block_size, refs = manager.sequences, manager.block_size, manager.pool.ref_counts
    cached = manager.cached_group_ids[0] if manager.enable_prefix_caching and manager.cached_group_ids else None
    plain = manager.window is None and num_tokens > 0
    for done, sequence_id in enumerate(sequence_ids):
        state = sequences.get(sequence_id) if plain else None
        if state is not None:
            length = state.sequence_length
            new_length = length + num_tokens
            table = state.block_tables[0]
            # (the conditions under which ``grow`` takes, copies, or ``_computed`` loads or caches, negated)
            if (new_length <= len(table) * block_size and state.num_computed_tokens == length
                    and not state.num_loading_tokens and (length % block_size == 0 or refs[table[-1]] == 1)
                    and (cached is None or new_length // block_size <= state.num_cached_blocks[cached])):
                state.sequence_length = state.num_computed_tokens = new_length
                continue
        try:
            manager.grow(sequence_id, num_tokens)
        except OutOfBlocksError:
            return done
    return len(sequence_ids)


def grow_together(manager: KVBlockManager, sequence_ids: Sequence[Hashable], num_tokens: int) -> int | None:
    """``grow_computed`` with one take from the free queue for all the sequences' new blocks and one cache call per
    group for all the blocks they fill, leaving the pool as ``grow`` one sequence at a time leaves it; None,
    nothing changed, where that could differ (the caller grows them one at a time).

    One at a time interleaves each sequence's take with the caching of the blocks the sequences before it
    filled. The order does not matter when no content the sequences cache is cached already (a take evicts only
    cached free blocks, so never an entry the caching makes or meets) and none is cached twice: then the takes
    come off the free queue in the same order, and the entries are made in the same order. Not under a sliding
    window (slides free blocks between the takes), after a fork (a shared last block is copied; another holder may
    have cached a block first), nor with a subscriber to the pool's events (the tiers want the order of single
    steps)."""
    pool, block_size = manager.pool, manager.block_size
    if manager.window is not None or manager.num_forks or pool.events.has_subscribers or num_tokens < 1:
        return None
    num_groups = len(manager.groups)
    cached_groups = manager.cached_group_ids if manager.enable_prefix_caching else []
    # Each sequence's lengths move as it is seen (one pass: a step's decodes are most of a replay's calls), and move
    # back where the call then answers None.
    loops = pool.loops
    grown = loops.grow_lengths(manager.sequences, sequence_ids, num_tokens, block_size, num_groups,
                               pool.free_blocks.num_free, cached_groups[0] if cached_groups else -1)
    if grown is None:  # (unknown, reserved ahead, loading: ``grow``'s own path)
        return None
    states, num_grown, num_taken, takes, fills = grown
    group_keys: dict[int, list[Hashable]] = {}
    for g in cached_groups if fills else ():  # (most single steps fill no block)
        keys = loops.fill_keys(fills, g, pool.cached_blocks[g])
        if keys is None:
            pool_loops.move_lengths(states[:num_grown], -num_tokens)
            return None
        group_keys[g] = keys
    if takes:
        taken: list[int] = []
        pool.take(num_taken, taken)
        loops.hand_out(takes, taken, num_groups, manager.past_final if num_groups == 1 else None, block_size)
    for g, keys in group_keys.items():  # (the blocks in the order the calls one by one cache them; each group's map)
        blocks = loops.fill_blocks(fills, g)
        if blocks:
            pool.cache_fresh(keys, blocks, g)
    return num_grown

