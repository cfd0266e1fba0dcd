"""The links between the GPU and the tiers below it: each direction a clock of when it is next free.

A link is one queue: a copy ends ``num_bytes / bytes_per_s`` after the later of its issue and the end of the copy
queued before it (vLLM's worker submits every store job to its transfer stream). A disk load crosses the disk's
read link, then the host link.

vLLM: vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py::start_kv_transfers
"""

from __future__ import annotations

import copy
from collections.abc import Sequence


class Link:
    """One direction of a link: a clock of when it is next free, and the seconds it was busy."""

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self.busy_until = 0.0
        self.busy_s = 0.0
        self.num_bytes = 0

    def finish(self, earliest: float, num_bytes: int) -> float:
        """When a copy of ``num_bytes`` queued at ``earliest`` would end (nothing reserved)."""
        return max(earliest, self.busy_until) + num_bytes / self.bytes_per_s

    def reserve(self, earliest: float, num_bytes: int) -> float:
        """Queue a copy of ``num_bytes`` behind the ones before it, no earlier than ``earliest``; when it ends."""
        self.busy_until = self.finish(earliest, num_bytes)
        self.busy_s += num_bytes / self.bytes_per_s
        self.num_bytes += num_bytes
        return self.busy_until


def load_times(read_links: Sequence[Link], counts: Sequence[int], bytes_per_block: int, now: float, *,
               commit: bool) -> tuple[float, float]:
    """(first byte, last byte) of a load of ``counts[i]`` blocks from tier ``i`` over its ``read_links[i]``.

    Host blocks cross the host link; disk blocks the disk's read link and then the host link. Without ``commit``
    the links' clocks stay as they are (the load is only priced)."""
    links = [link if commit else copy.copy(link) for link in read_links]
    host = links[0]
    start = done = max(now, host.busy_until)
    if counts[0]:
        done = host.reserve(now, counts[0] * bytes_per_block)
    if len(counts) > 1 and counts[1]:
        if not counts[0]:
            start = max(now, links[1].busy_until)
        from_disk = links[1].reserve(now, counts[1] * bytes_per_block)
        done = host.reserve(from_disk, counts[1] * bytes_per_block)
    return start, done
