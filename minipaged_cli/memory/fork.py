"""Forked sequences and copy-on-write: the block manager's part that lets two block tables share a partly filled
block (parallel sampling and beam search in vLLM's first engine; its block manager over KV cache groups forks
nothing: parallel samples are separate requests sharing prompts through prefix caching)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.sequence import DuplicateSequenceError, SequenceState, UncomputedForkError


class CopyOnWrite:
    """Forks share every block of their parent; the first write into a shared, partly filled last block copies it.

    Invariant: ``pending_copies`` holds every (src, dst) copy decided since the data plane last took them, in the
    order they were decided; ``dst`` is the writer's new block, ``src`` stays with the other holders.
    """

    pool: BlockPool
    block_size: int
    groups: tuple[object, ...]
    sequences: dict[Hashable, SequenceState]
    sequence: Callable[[Hashable], SequenceState]  # the live sequence, or UnknownSequenceError

    def __init__(self) -> None:
        self.pending_copies: list[tuple[int, int]] = []  # decided, not yet taken by the data plane
        self.num_copy_on_writes = 0
        self.num_forks = 0

    def fork(self, parent_id: Hashable, child_id: Hashable, *,
             block_hashes: Sequence[Hashable] | None = None) -> SequenceState:
        """A child sharing every block of the parent: no block is copied until one of them writes into a shared,
        partly filled block. ``block_hashes``: the child's content hashes (by default the parent's, up to its full
        blocks, since their continuations differ). The parent's tokens must all be computed: a fork shares K/V,
        not reservations."""
        parent = self.sequence(parent_id)
        if len(self.groups) > 1:
            raise ValueError("a model with several KV cache groups forks no sequence (vLLM runs its parallel samples "
                             "as separate requests)")
        if child_id in self.sequences:
            raise DuplicateSequenceError(f"sequence {child_id!r} already exists")
        if parent.num_computed_tokens < parent.sequence_length:
            raise UncomputedForkError(f"sequence {parent_id!r} has computed {parent.num_computed_tokens} of its "
                                      f"{parent.sequence_length} tokens; fork it once its prefill has run")
        if block_hashes is None:
            block_hashes = parent.block_hashes[: parent.sequence_length // self.block_size]
        for block in parent.block_table:
            self.pool.reference(block)
        offered = min(parent.num_computed_tokens // self.block_size, len(block_hashes))  # (as its parent's)
        child = SequenceState(child_id, parent.sequence_length, [list(parent.block_table)], list(block_hashes),
                              parent.num_cached_tokens, parent.num_computed_tokens, [0], [offered],
                              num_held_blocks=len(parent.block_table))
        self.sequences[child_id] = child
        self.num_forks += 1
        return child

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies that copy-on-write decided since the last call; the data plane must
        run them before writing the new tokens."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def _needs_copy(self, state: SequenceState, num_tokens: int) -> int:
        """1 when the next token would be written into a partly filled block another sequence holds."""
        if num_tokens == 0 or state.sequence_length % self.block_size == 0:
            return 0
        return int(self.pool.ref_counts[state.block_tables[0][-1]] > 1)

    def _copy_last_block(self, state: SequenceState) -> None:
        """Give the sequence its own copy of its shared last block (the caller has checked one block is free)."""
        table = state.block_table
        shared = table.pop()
        self.pool.take(1, table)  # (the held count is unchanged: one entry for another)
        self.pool.drop_shared(shared)
        self.pending_copies.append((shared, table[-1]))
        self.num_copy_on_writes += 1
