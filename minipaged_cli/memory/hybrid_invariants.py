"""The KV cache groups' invariant checker: the invariants ``HybridBlockManager``'s docstring states, each broken one
as a sentence naming the bug it points to. Pool-wide rules (free queue, cache map) are ``invariants.py``'s."""

from __future__ import annotations

from typing import Any

from minipaged_cli.memory.block_pool import num_blocks_for
from minipaged_cli.memory.invariants import _cache_violations, _free_queue_violations, reference_count_violations

NULL_BLOCK = -1  # vLLM's null block (its block 0) in our ids, which are vLLM's minus one


def hybrid_manager_violations(manager: Any) -> list[str]:
    """Every broken invariant of a ``HybridBlockManager``; empty when all hold."""
    pool = manager.pool
    touched = pool.free_blocks.num_touched
    problems: list[str] = []
    holders = [0] * touched
    for state in manager.sequences.values():
        problems += _sequence_violations(manager, state, touched)
        for table in state.block_tables:
            for block in table:
                if 0 <= block < touched:
                    holders[block] += 1
    if problems:
        return problems
    problems += reference_count_violations(pool, holders, "table entries hold it",
                                           "a window freed a block twice, or a hit was not referenced")
    return problems + _free_queue_violations(manager, holders) + _cache_violations(pool, touched)


def _sequence_violations(manager: Any, state: Any, touched: int) -> list[str]:
    """One sequence's tables: lengths, null prefixes, the window, blocks held once, cached content."""
    sid, problems = state.sequence_id, []
    expected = num_blocks_for(state.sequence_length, manager.block_size)
    reachable = manager.skipped_blocks(state.num_computed_tokens + state.num_loading_tokens)
    computed_blocks = state.num_computed_tokens // manager.block_size
    seen: set[int] = set()
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
    for g, (table, nulls) in enumerate(zip(state.block_tables, state.num_null, strict=True)):
        if len(table) != expected:
            problems.append(f"sequence {sid!r} group {g} holds {len(table)} entries for {state.sequence_length} "
                            f"tokens, expected {expected}: a group grew alone")
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
        if any(not 0 <= block < touched for block in held):
            problems.append(f"sequence {sid!r} group {g} holds a block outside the {touched} handed out")
            continue
        if seen.intersection(held) or len(set(held)) != len(held):
            problems.append(f"sequence {sid!r} holds a block twice: two tokens (or groups) share a slot")
        seen.update(held)
        for index in range(nulls, len(table)):
            cached = manager.pool.block_hash[table[index]]
            if cached is None:
                continue
            if index >= len(state.block_hashes) or cached != state.block_hashes[index] or \
                    manager.pool.block_group[table[index]] != g:
                problems.append(f"block {table[index]} of group {g} is cached under a hash that is not its content "
                                f"in sequence {sid!r}: a stale prefix-cache entry")
            elif index >= computed_blocks:
                problems.append(f"block {table[index]} is cached but sequence {sid!r} has not computed it")
            elif index >= state.num_cached_blocks[g]:
                problems.append(f"block {table[index]} of group {g} is cached past the {state.num_cached_blocks[g]} "
                                f"blocks sequence {sid!r} offered to the cache: cached twice, or a stale count")
    return problems
