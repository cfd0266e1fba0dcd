"""A sequence as the block manager holds it (``SequenceState``), and the errors the block manager's calls raise."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field


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


@dataclass
class SequenceState:
    """One live sequence: how many tokens it holds and where they are.

    ``sequence_length`` is the number of tokens with a slot, and so the position of the next append.
    ``block_table[i]`` is the physical block holding logical block ``i``. ``block_hashes[i]`` is the chained
    content hash of full block ``i`` where the caller knows its content (prefix caching registers a block under
    it once it is full and computed); ``num_cached_tokens`` are the prompt tokens found in the prefix cache at
    creation; ``num_computed_tokens`` (<= ``sequence_length``) those whose K/V is written: a prompt reserved
    whole and prefilled in chunks holds slots ahead of its computed tokens.
    """

    sequence_id: Hashable
    sequence_length: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[Hashable] = field(default_factory=list, repr=False)
    num_cached_tokens: int = 0
    num_computed_tokens: int = field(default=0, compare=False)  # progress, not identity: equal states compare equal
