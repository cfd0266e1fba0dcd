"""The block manager's invariant checker: every broken invariant as a sentence naming the bug it points to.

The invariants are written in ``KVBlockManager``'s docstring; this module only checks them, from the block tables
outwards (who holds which block) against what the pool believes (reference counts, free queue, cache map).
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
    problems: list[str] = []
    holders = [0] * manager.num_physical_blocks
    out_of_range: set[int] = set()
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
            if not 0 <= block < manager.num_physical_blocks:
                out_of_range.add(block)
                continue
            holders[block] += 1
            cached = pool.block_hash[block]
            if cached is None:
                continue
            if index >= len(state.block_hashes) or state.block_hashes[index] != cached:
                problems.append(f"block {block} is cached under a hash that is not its content in sequence "
                                f"{state.sequence_id!r}: a stale prefix-cache entry")
            elif index >= computed_blocks:
                problems.append(f"block {block} is cached but sequence {state.sequence_id!r} has not computed "
                                "it: a block published before its K/V was written")
    miscounted = [b for b in range(manager.num_physical_blocks) if holders[b] != pool.ref_counts[b]]
    if miscounted:
        b = miscounted[0]
        problems.append(f"block {b} has ref count {pool.ref_counts[b]} but {holders[b]} tables hold it: "
                        f"{len(miscounted)} blocks miscounted (a lost reference, a double free, or two "
                        "sequences given one block)")
    if pool.num_shared_references != sum(max(h - 1, 0) for h in holders):
        problems.append("the shared-reference count disagrees with the block tables")
    out_of_range |= {b for b in pool.free_blocks if not 0 <= b < manager.num_physical_blocks}
    free_set = set(pool.free_blocks) - out_of_range
    allocated_set = {b for b in range(manager.num_physical_blocks) if holders[b]}
    if allocated_set & free_set:
        problems.append(f"blocks {sorted(allocated_set & free_set)[:5]} are both allocated and free")
    if len(allocated_set) + len(free_set) != manager.num_physical_blocks:
        problems.append(
            f"{len(allocated_set)} allocated + {len(free_set)} free != {manager.num_physical_blocks} blocks: "
            "a block leaked"
        )
    if out_of_range:
        problems.append(f"block ids {sorted(out_of_range)[:5]} are outside the pool")
    if any(pool.block_hash[b] is not None and pool.cached_blocks.get(pool.block_hash[b]) != b
           for b in range(manager.num_physical_blocks)) or \
            any(pool.block_hash[b] != h for h, b in pool.cached_blocks.items()):
        problems.append("the prefix-cache map and the blocks' hashes disagree: an entry survived eviction")
    queued_cached = list(pool.free_blocks)[len(pool.free_blocks) - pool.free_blocks.num_cached:]
    if sum(pool.block_hash[b] is not None for b in free_set) != len(queued_cached) or \
            any(pool.block_hash[b] is None for b in queued_cached if 0 <= b < manager.num_physical_blocks):
        problems.append("the free queue files a block under the wrong part (cached vs empty): an eviction "
                        "ahead of an empty block, or a revival that cannot find its block")
    return problems
