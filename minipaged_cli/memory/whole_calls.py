"""The Python side of the compiled module's whole calls (``pool_loops.c``): each runs a whole call of the pool, the
block manager or the allocator (a take, a caching, a release, a step's growth, a creation, an admission check, a
removal from the free queue) in one compiled call where the pool is in its usual case, and answers False (or None)
with nothing changed where it is not, so that the caller's own Python path runs. Here they answer so always: that
path is their reference, and the tests drive both (``pool_loops.loops()`` hands out the compiled ones or these).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minipaged_cli.memory.sequence import SequenceState


def take_into(pool: object, count: int, table: list[int]) -> bool:
    """``pool.take(count, table)`` in one call where it is the usual case (one group, no subscriber to the pool's
    events and no key log, no duplicate entry): True, the blocks taken; else False, nothing changed, and the pool's
    own path takes them. Here in Python that path is the reference: False, always (``tests/memory/test_take_into.py``
    runs both on random pools and compares them)."""
    return False


def cache_into(pool: object, block_hashes: Sequence[Hashable], blocks: Sequence[int], group: int) -> bool:
    """``pool.cache_fresh(block_hashes, blocks, group)`` in one call where it is the usual case (one group, no
    subscriber to the pool's events and no key log): True, cached; else False, nothing changed, and the pool's own
    path caches them. Here in Python that path is the reference: False, always (``take_into``'s test runs both)."""
    return False


def grow_batch(manager: object, sequences: Sequence[object], num_tokens: int) -> int | bool | None:
    """``batched_growth.grow_together`` in one call where the pool is in its usual case (one group, no subscriber to
    its events and no key log), each sequence named by its id or by its ``Holding``: its answer; else False, nothing
    changed, and its Python path runs. Here in Python that path is the reference: False, always
    (``tests/memory/test_grow_computed.py`` and ``tests/sim/test_batched_growth.py`` run both against growing one
    sequence at a time)."""
    return False


def release_into(pool: object, table: list[int], num_keyed: int) -> bool:
    """``pool.release_split`` of one table's first ``num_keyed`` blocks and of the rest, each part tail first (how
    ``KVCacheCoordinator.release_tables`` releases a sequence under one full-attention group) in one call: True,
    released; else False, nothing changed, and the pool's own path releases them. Here in Python that path is the
    reference: False, always (``take_into``'s test runs both)."""
    return False


def create_into(manager: object, sequence_id: Hashable, num_tokens: int, block_hashes: Sequence[Hashable],
                num_computed: int, final_length: int | None, hits: list[int] | None) -> SequenceState | bool:
    """``manager.create_sequence`` in one call where it is the usual case (one full-attention group and no fork, the
    pool's usual case without duplicate entries, a list of keys, enough free blocks): the state; else False, nothing
    changed, and its Python path runs. ``hits``: the blocks ``find_hits`` found (None: where the first key has an
    entry, the Python path finds them). Here in Python that path is the reference: False, always (``take_into``'s
    test runs both)."""
    return False


def admission_headroom(manager: object, block_hashes: Sequence[Hashable], num_tokens: int,
                       keep_free_blocks: int) -> int | None:
    """``PagedAllocator.admission_headroom`` in one call where no group slides and the prompt can hit nothing
    (``find_hits``' first test: no caching, one block or less, no keys, or a first key without an entry) or has one
    group (its hit walked as ``search_hits`` walks it); else None, and its Python path answers. Here in Python that
    path is the reference: None, always (``test_paged.py`` runs both)."""
    return None


def release_sequence_into(manager: object, sequence_id: Hashable, kept: int) -> bool:
    """``manager.release_sequence`` in one call where the manager is in its usual case (one full-attention group, no
    fork, the pool's usual case) and the sequence is live, ``kept`` the released ids it remembers: True; else False,
    nothing changed, and its Python path runs (the reference: here, False always)."""
    return False


def remove_free(queue: object, blocks: Sequence[int]) -> bool:
    """``queue.remove(*blocks)`` (``FreeBlockQueue``: hits take cached blocks out of its back part) in one call: True;
    False where its parts are not its own kinds. Here in Python the queue's own method is the reference: False."""
    return False
