"""A request's prompt block keys as a router reads them, built only as far as its lookups reach.

A precise prefix lookup stops at a replica's first uncached block, and most of a long prompt is cached on no
replica, while building a key costs a content hash per run of tokens (a Mooncake prompt: one per 512-token
segment). So the keys of the prompt's first shared segments are built first, and more (twice as many segments
each time) only while a lookup matches every key built so far. A block's key chains the whole stream before it
(``memory/prefix.py``), so the keys of the prompt cut after its k-th segment are the whole prompt's first keys
(every block that lies within those segments): the keys of those segments' stream alone, the stream with which
``content_keys`` starts.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from minipaged_cli.memory.prefix import segment_keys
from minipaged_cli.sim.scheduler import content_keys
from minipaged_cli.workloads.request import Request

FIRST_SEGMENTS = 2  # the shared segments the first lookup's keys cover


class PromptKeys:
    """The keys of a request's full prompt blocks (``content_keys``, as its replica names them), ``keys`` the
    first of them built so far; ``lazy=False`` builds them all at once (the reference).

    Invariant: ``keys`` is a prefix of the whole prompt's keys, all of them once ``complete``.
    """

    def __init__(self, request: Request, fleet_index: int, segments: dict[str, int], block_size: int, *,
                 lazy: bool = True) -> None:
        self.request = request
        self.fleet_index = fleet_index
        self.segments = segments
        self.block_size = block_size
        self.num_blocks = request.prompt_tokens // block_size
        self.keys: list[Hashable] = []
        self.num_segments = 0  # of ``request.prefix``, those ``keys`` cover while not complete
        self.complete = False
        if not lazy:
            self.all()

    def all(self) -> list[Hashable]:
        """Every full prompt block's key."""
        if not self.complete:
            request = self.request
            self.keys = content_keys(request, self.fleet_index, 0, self.segments, self.block_size)[
                :request.prompt_tokens // self.block_size]
            self.complete = True
        return self.keys

    def matched(self, lookup: Callable[[Sequence[Hashable]], int]) -> int:
        """``lookup`` (the leading keys cached) over the whole prompt's keys, built as far as it matches."""
        while True:
            matched = lookup(self.keys)
            if matched < len(self.keys) or self.complete:
                return matched
            self._build_more()

    def _build_more(self) -> None:
        prefix = self.request.prefix
        self.num_segments = max(FIRST_SEGMENTS, 2 * self.num_segments)
        if self.request.runs or self.num_segments >= len(prefix):
            self.all()
            return
        self.keys = segment_keys(prefix[:self.num_segments], self.segments, (), self.block_size)
