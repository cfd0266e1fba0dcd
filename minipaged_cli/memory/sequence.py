"""A sequence as the block manager holds it (``SequenceState``), and the errors the block manager's calls raise."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

NULL_BLOCK = -1  # vLLM's null block (its block 0) in our ids, which are vLLM's minus one


class BlockManagerError(Exception):
    """Base class of every error the block manager raises; a failed call changes nothing."""


class OutOfBlocksError(BlockManagerError):
    """The pool has fewer free blocks than the call needs."""


class UnknownSequenceError(BlockManagerError, KeyError):
    """The sequence id was never created (or was released and not created again)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateSequenceError(BlockManagerError):
    """``create_sequence`` with an id that is already live."""


class DoubleReleaseError(UnknownSequenceError):
    """``release_sequence`` on a sequence that was recently released."""


class UncomputedForkError(BlockManagerError):
    """``fork`` of a sequence whose reserved tokens are not all computed yet."""


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """ceil(num_tokens / block_size): blocks a sequence of that length holds."""
    return -(-num_tokens // block_size)


def tail_waste(num_tokens: int, block_size: int) -> int:
    """Slots allocated but unused in a sequence's last block: 0 if L % B == 0, else B - L % B."""
    return num_blocks_for(num_tokens, block_size) * block_size - num_tokens

@dataclass(slots=True)
class SequenceState:
    """One live sequence: how many tokens it holds and where they are.

    ``sequence_length`` is the number of tokens with a slot, and so the position of the next append.
    ``block_tables[g][i]`` is the physical block holding logical block ``i`` in KV cache group ``g`` (``NULL_BLOCK``
    where a sliding window let go of it); ``block_table`` is group 0's, a single-group model's only table.
    ``block_hashes[i]`` is the chained content hash of full block ``i`` where the caller knows its content (prefix
    caching registers a block under it once it is full and computed); ``num_cached_tokens`` are the prompt tokens
    found in the prefix cache at creation; ``num_computed_tokens`` (<= ``sequence_length``) those whose K/V is
    written: a prompt reserved whole and prefilled in chunks holds slots ahead of its computed tokens.

    Per group: ``num_null[g]`` leading null entries, ``num_cached_blocks[g]`` entries offered to the prefix cache
    (vLLM's ``num_cached_block``). ``num_loading_tokens``: tokens after the computed ones that a tier below the GPU
    loads (vLLM's ``num_external_computed_tokens``); ``num_held_blocks``: entries that are not null, over all
    tables (a count: the accounting asks for it per sequence and step); ``final_length``: the most tokens the caller
    will give it (None: not known), past which a table's slots are never filled.
    """

    sequence_id: Hashable
    sequence_length: int = 0
    block_tables: list[list[int]] = field(default_factory=lambda: [[]])
    block_hashes: list[Hashable] = field(default_factory=list, repr=False)
    num_cached_tokens: int = 0
    # progress, not identity: equal states compare equal
    num_computed_tokens: int = field(default=0, compare=False)
    num_null: list[int] = field(default_factory=lambda: [0], compare=False)
    num_cached_blocks: list[int] = field(default_factory=lambda: [0], compare=False)
    num_loading_tokens: int = field(default=0, compare=False)
    num_held_blocks: int = field(default=0, compare=False)
    final_length: int | None = field(default=None, compare=False)

    @property
    def block_table(self) -> list[int]:
        """Group 0's table (a single-group model's only one: what a data plane addresses)."""
        return self.block_tables[0]

    def holds_past_final(self, block_size: int) -> bool:
        """Whether group 0's table holds slots past ``final_length`` (never where that is not known): what a
        manager's ``past_final`` lists."""
        return self.final_length is not None and len(self.block_tables[0]) * block_size > self.final_length
