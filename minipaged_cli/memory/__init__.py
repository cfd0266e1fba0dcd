"""The metadata plane: which physical KV block holds which token of which sequence (the block manager), and
the allocation strategies the simulator compares (paged through the block manager, contiguous extents).
Imports neither torch nor anything above it."""

from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.prefix import content_hash, hash_blocks, token_block_contents
from minipaged_cli.memory.sequence import (
    BlockManagerError,
    DoubleReleaseError,
    DuplicateSequenceError,
    OutOfBlocksError,
    SequenceState,
    UncomputedForkError,
    UnknownSequenceError,
)

__all__ = ["BlockManagerError", "DoubleReleaseError", "DuplicateSequenceError", "KVBlockManager", "OutOfBlocksError",
           "SequenceState", "UncomputedForkError", "UnknownSequenceError", "content_hash", "hash_blocks",
           "token_block_contents"]
