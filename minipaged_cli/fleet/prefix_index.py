"""The approximate prefix index: the router's own memory of which block hashes it sent to which replica (llm-d's
approximate prefix-cache scorer), least recently sent forgotten first once it holds ``capacity`` entries.

Invariant: at most ``capacity`` (replica, hash) entries, in the order they were last sent.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class ApproximateIndex:
    """An LRU set of (replica, block hash) entries."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[tuple[int, Hashable], None] = OrderedDict()
        self.num_forgotten = 0

    def sent(self, replica: int, block_hashes: Sequence[Hashable]) -> None:
        """The router sent a request with these blocks to ``replica``: they are its most recent entries."""
        entries = self.entries
        for key in block_hashes:
            entry = (replica, key)
            if entry in entries:
                entries.move_to_end(entry)
            else:
                entries[entry] = None
        while len(entries) > self.capacity:
            entries.popitem(last=False)
            self.num_forgotten += 1

    def matched_blocks(self, replica: int, block_hashes: Sequence[Hashable]) -> int:
        """How many of ``block_hashes``, from the first, the index says ``replica`` holds."""
        entries = self.entries
        for matched, key in enumerate(block_hashes):
            if (replica, key) not in entries:
                return matched
        return len(block_hashes)
