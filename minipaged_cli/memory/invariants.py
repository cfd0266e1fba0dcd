"""The block manager's invariant checker: every broken invariant as a sentence naming the bug it points to.

The invariants are written in ``KVBlockManager``'s docstring; this module only checks them, from the block tables
outwards (who holds which block) against what the pool believes (reference counts, free queue, cache map). It
looks only at the blocks the pool has handed out at least once: the untouched rest is free by construction.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

from minipaged_cli.memory.block_pool import BlockPool, num_blocks_for


class BlockTables(Protocol):
    """What the checker reads of a block manager: its sequences' tables over a pool."""

    num_physical_blocks: int
    block_size: int
    sequences: dict[Hashable, Any]  # id -> SequenceState
    pool: BlockPool


def block_manager_violations(manager: BlockTables) -> list[str]:
    """Every broken invariant of ``manager``; empty when all hold."""
    pool = manager.pool
    touched = pool.free_blocks.num_touched
    holders = [0] * touched  # per handed-out block: the tables holding it
    problems = _table_violations(manager, holders)
    if len(pool.ref_counts) != touched or len(pool.block_hash) != touched:
        problems.append(f"the pool keeps state for {len(pool.ref_counts)} blocks but has handed out {touched}")
        return problems
    problems += reference_count_violations(pool, holders, "tables hold it",
                                           "a lost reference, a double free, or two sequences given one block")
    problems += _free_queue_violations(manager, holders)
    problems += _cache_violations(pool, touched)
    return problems


def _table_violations(manager: BlockTables, holders: list[int]) -> list[str]:
    """Each sequence's table against its length, its computed tokens and the cache; counts the tables holding
    each block into ``holders`` on the way (one walk over the tables)."""
    pool = manager.pool
    touched = len(holders)
    problems = []
    outside: set[int] = set()
    for state in manager.sequences.values():
        expected = num_blocks_for(state.sequence_length, manager.block_size)
        if len(state.block_table) != expected:
            problems.append(
                f"sequence {state.sequence_id!r} holds {len(state.block_table)} blocks for "
                f"{state.sequence_length} tokens, expected {expected}: a block taken too early or leaked"
            )
        if len(set(state.block_table)) != len(state.block_table):
            problems.append(f"sequence {state.sequence_id!r} holds a block twice: two of its tokens share a slot")
        if not 0 <= state.num_computed_tokens <= state.sequence_length:
            problems.append(f"sequence {state.sequence_id!r} has {state.num_computed_tokens} computed tokens "
                            f"of {state.sequence_length}")
        computed_blocks = state.num_computed_tokens // manager.block_size
        for index, block in enumerate(state.block_table):
            if not 0 <= block < touched:
                outside.add(block)
                continue
            holders[block] += 1
            cached = pool.block_hash[block] if block < len(pool.block_hash) else None
            if cached is None:
                continue
            if index >= len(state.block_hashes) or state.block_hashes[index] != cached:
                problems.append(f"block {block} is cached under a hash that is not its content in sequence "
                                f"{state.sequence_id!r}: a stale prefix-cache entry")
            elif index >= computed_blocks:
                problems.append(f"block {block} is cached but sequence {state.sequence_id!r} has not computed "
                                "it: a block published before its K/V was written")
    if outside:
        problems.append(f"block ids {sorted(outside)[:5]} are held but outside the {touched} blocks the pool "
                        f"handed out (of {manager.num_physical_blocks}): a block taken around the pool")
    return problems


def reference_count_violations(pool: Any, holders: list[int], held_by: str, causes: str) -> list[str]:
    """Each handed-out block's reference count against ``holders`` (the table entries holding it, counted by the
    caller's walk), and the pool's shared-reference count against the same."""
    problems = []
    miscounted = [b for b in range(len(holders)) if holders[b] != pool.ref_counts[b]]
    if miscounted:
        b = miscounted[0]
        problems.append(f"block {b} has ref count {pool.ref_counts[b]} but {holders[b]} {held_by}: "
                        f"{len(miscounted)} blocks miscounted ({causes})")
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
    """The hash -> blocks map against each block's hash."""
    cached, duplicates, block_keys = pool.keyed_cache()
    entries = [(h, b) for h, b in cached.items()]
    entries += [(h, b) for h, blocks in duplicates.items() for b in blocks]
    if any(not 0 <= b < touched or block_keys[b] != h for h, b in entries) or \
            len({b for _, b in entries}) != len(entries) or \
            sum(h is not None for h in block_keys) != len(entries) or \
            any(h not in cached or not blocks for h, blocks in duplicates.items()):
        return ["the prefix-cache map and the blocks' hashes disagree: an entry survived eviction"]
    return []
