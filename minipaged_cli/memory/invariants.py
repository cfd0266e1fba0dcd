"""The block manager's invariant checker: every broken invariant as a sentence naming the bug it points to.

The invariants are written in ``KVBlockManager``'s docstring; this module only checks them, from the block tables
outwards (who holds which block, in which group) against what the pool believes (reference counts, free queue,
cache maps). It looks only at the blocks the pool has handed out at least once: the untouched rest is free by
construction.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.pool_loops import PRIVATE
from minipaged_cli.memory.sequence import NULL_BLOCK, SequenceState, num_blocks_for


class BlockTables(Protocol):
    """What the checker reads of a block manager: its sequences' tables over a pool, per group."""

    num_physical_blocks: int
    block_size: int
    groups: Sequence[Any]  # KVCacheGroup
    sliding_ids: list[int]
    cached_group_ids: list[int]
    sequences: dict[Hashable, SequenceState]
    pool: BlockPool

    def skipped_blocks(self, num_computed_tokens: int) -> int: ...


def block_manager_violations(manager: BlockTables) -> list[str]:
    """Every broken invariant of ``manager``; empty when all hold."""
    pool = manager.pool
    touched = pool.free_blocks.num_touched
    holders = [0] * touched  # per handed-out block: the table entries holding it
    problems: list[str] = []
    for state in manager.sequences.values():
        problems += _sequence_violations(manager, state, holders)
    if len(pool.ref_counts) != touched or len(pool.block_hash) != touched:
        problems.append(f"the pool keeps state for {len(pool.ref_counts)} blocks but has handed out {touched}")
        return problems
    problems += _reference_count_violations(pool, holders)
    problems += _free_queue_violations(manager, holders)
    problems += _cache_violations(pool, touched)
    return problems


def _sequence_violations(manager: BlockTables, state: SequenceState, holders: list[int]) -> list[str]:
    """One sequence's tables against its length, its window, its computed tokens and the cache; counts the entries
    holding each block into ``holders`` on the way (one walk over the tables)."""
    sid, touched, problems = state.sequence_id, len(holders), []
    expected = num_blocks_for(state.sequence_length, manager.block_size)
    reachable = manager.skipped_blocks(state.num_computed_tokens + state.num_loading_tokens)
    computed_blocks = state.num_computed_tokens // manager.block_size
    if not 0 <= state.num_computed_tokens <= state.sequence_length:
        problems.append(f"sequence {sid!r} has {state.num_computed_tokens} computed tokens of {state.sequence_length}")
    if len({state.num_null[g] for g in manager.sliding_ids}) > 1:
        problems.append(f"sequence {sid!r}: its sliding groups hold {state.num_null} null entries, expected one "
                        f"count: a window slid in one group alone")
    if len({state.num_cached_blocks[g] for g in manager.cached_group_ids}) > 1:
        problems.append(f"sequence {sid!r}: its groups count {state.num_cached_blocks} blocks offered to the cache, "
                        f"expected one count: a group cached alone")
    num_held = sum(len(table) - nulls for table, nulls in zip(state.block_tables, state.num_null, strict=True))
    if state.num_held_blocks != num_held:
        problems.append(f"sequence {sid!r} counts {state.num_held_blocks} held blocks, its tables hold {num_held}: a "
                        "table changed without its count")
    seen: set[int] = set()
    for g, (table, nulls) in enumerate(zip(state.block_tables, state.num_null, strict=True)):
        if len(table) != expected:
            problems.append(f"sequence {sid!r} group {g} holds {len(table)} blocks for {state.sequence_length} "
                            f"tokens, expected {expected}: a block taken too early or leaked, or a group grew alone")
        null_at = [i for i, block in enumerate(table) if block == NULL_BLOCK]
        if null_at != list(range(nulls)):
            problems.append(f"sequence {sid!r} group {g}: null entries at {null_at[:5]}, expected the first "
                            f"{nulls}: a block freed out of order")
        if nulls and not manager.groups[g].is_sliding:
            problems.append(f"sequence {sid!r}: full-attention group {g} let go of a block")
        if nulls > reachable:
            problems.append(f"sequence {sid!r} group {g} freed {nulls} blocks but its window still reaches block "
                            f"{reachable}: a block freed while the next token attends to it")
        held = table[nulls:]
        outside = sorted({block for block in held if not 0 <= block < touched})
        if outside:
            problems.append(f"sequence {sid!r} group {g} holds block ids {outside[:5]} outside the {touched} blocks "
                            f"the pool handed out (of {manager.num_physical_blocks}): a block taken around the pool")
            continue
        if seen.intersection(held) or len(set(held)) != len(held):
            problems.append(f"sequence {sid!r} holds a block twice: two tokens (or groups) share a slot")
        seen.update(held)
        for index in range(nulls, len(table)):
            block = table[index]
            holders[block] += 1
            cached = manager.pool.block_hash[block] if block < len(manager.pool.block_hash) else None
            if cached is None:
                continue
            if index >= len(state.block_hashes) or cached != state.block_hashes[index] or \
                    manager.pool.block_group[block] != g:
                problems.append(f"block {block} of group {g} is cached under a hash that is not its content in "
                                f"sequence {sid!r}: a stale prefix-cache entry")
            elif index >= computed_blocks:
                problems.append(f"block {block} is cached but sequence {sid!r} has not computed it: a block "
                                "published before its K/V was written")
            elif index >= state.num_cached_blocks[g]:
                problems.append(f"block {block} of group {g} is cached past the {state.num_cached_blocks[g]} blocks "
                                f"sequence {sid!r} offered to the cache: cached twice, or a stale count")
    return problems


def _reference_count_violations(pool: BlockPool, holders: list[int]) -> list[str]:
    """Each handed-out block's reference count against ``holders``, and the pool's shared-reference count
    against the same."""
    problems = []
    miscounted = [b for b in range(len(holders)) if holders[b] != pool.ref_counts[b]]
    if miscounted:
        b = miscounted[0]
        problems.append(f"block {b} has ref count {pool.ref_counts[b]} but {holders[b]} tables hold it: "
                        f"{len(miscounted)} blocks miscounted (a lost reference, a double free, a window that freed "
                        "a block twice, or two sequences given one block)")
    if pool.num_shared_references != sum(max(h - 1, 0) for h in holders):
        problems.append("the shared-reference count disagrees with the block tables")
    return problems


def _free_queue_violations(manager: BlockTables, holders: list[int]) -> list[str]:
    """The free queue against the tables: every touched block free exactly when no table holds it."""
    pool = manager.pool
    touched = len(holders)
    front, back = pool.free_blocks.touched()
    problems = pool.free_blocks.violations()
    queued = front + back
    if len(set(queued)) != len(queued):
        problems.append("a block sits twice in the free queue: a double free")
    if any(not 0 <= b < touched for b in queued):
        problems.append(f"the free queue holds ids outside the {touched} blocks handed out: a corrupt queue")
        return problems
    both = sorted(b for b in set(queued) if holders[b])
    if both:
        problems.append(f"blocks {both[:5]} are both allocated and free")
    allocated = sum(1 for h in holders if h)
    num_free = len(queued) + pool.free_blocks.num_blocks - touched  # its parts, untouched blocks included
    if allocated + num_free != manager.num_physical_blocks:
        problems.append(f"{allocated} allocated + {num_free} free != {manager.num_physical_blocks} blocks: "
                        "a block leaked")
    if len(pool.free_blocks) != num_free:
        problems.append(f"the free queue counts {len(pool.free_blocks)} free blocks but holds {num_free}: an "
                        "update that moved blocks without counting them")
    if any(pool.block_hash[b] is not None for b in front):
        problems.append("a cached block waits at the free queue's front: it would be evicted before empty blocks")
    return problems


def _cache_violations(pool: BlockPool, touched: int) -> list[str]:
    """The hash -> blocks maps against each block's hash."""
    cached, duplicates, block_keys = pool.keyed_cache()
    entries = [(h, b) for h, b in cached.items()]
    entries += [(h, b) for h, blocks in duplicates.items() for b in blocks]
    if any(not 0 <= b < touched or block_keys[b] != h for h, b in entries) or \
            len({b for _, b in entries}) != len(entries) or \
            sum(h is not None and h is not PRIVATE for h in block_keys) != len(entries) or \
            any(h not in cached or not blocks for h, blocks in duplicates.items()):
        return ["the prefix-cache map and the blocks' hashes disagree: an entry survived eviction"]
    return []
