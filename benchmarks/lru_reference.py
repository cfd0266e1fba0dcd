"""An independent, deliberately naive prefix-cache replay of the Mooncake traces: the figures tiers must meet.

No minipaged code: the traces are read with ``json``, the caches are dicts. Requests are replayed in timestamp order
(a stable sort: requests of one ~3 s bucket keep their file order), each as its list of content keys; a request's
hit is the longest run of its keys, from the first, present in the cache; then every key is touched (a hit, or a
key present past the first miss, refreshes it; a missing key is inserted, evicting one when the cache is full).
Nothing is in flight: a request's blocks are cached the moment it arrives, as if its prefill took no time.

Two granularities, each matching one published set of figures (share of prompt tokens):

- ``chunk_size=512``: the traces' own hash blocks, one key per ``hash_id``. The last, partial block is a key like
  the others, counts its own tokens when hit and takes a whole slot of the capacity (a paged pool's block). This
  reproduces the plain-LRU figures the issue quotes (conversation 37.4 % unlimited, 13.8 / 29.1 / 36.6 % at
  3M / 10M / 30M tokens; synthetic 65.1 / 31.5 / 57.7 / 65.1 %). Two choices move them: leaving the partial block
  out (always a miss) gives synthetic 65.0 % unlimited; counting every present block, not only the prefix, gives
  conversation 13.9 % at 3M.
- ``chunk_size=256``: LMCache's simulator (lmcache 0.5.6, ``lmcache.tools.cache_simulator``): each 512-token block
  split into two 256-token halves, key ``(hash_id, half)``, and only full chunks stored, so a request's last
  ``input_length % 256`` tokens are always a miss. Capacity is ``tokens // 256`` chunks. This reproduces LMCache's
  LRU figures to the hundredth at every size, and its LFU (hit count, FIFO among equal counts; LMCache's
  ``LFUCachePolicy``) and FIFO (hits do not refresh) figures at 3M.

    python benchmarks/lru_reference.py [--traces DIR]
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from pathlib import Path

HASH_BLOCK_TOKENS = 512  # the Mooncake traces' hash_ids cover 512 prompt tokens each
TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
DECIMALS = {512: 1, 256: 2}  # as published, per chunk size: the plain-LRU figures to 0.1 %, LMCache's to 0.01 %

# (trace, chunk_size, policy) -> {capacity in tokens (None: unlimited): published % of prompt tokens}
PUBLISHED: dict[tuple[str, int, str], dict[int | None, float]] = {
    ("conversation", 512, "lru"): {None: 37.4, 3_000_000: 13.8, 10_000_000: 29.1, 30_000_000: 36.6},
    ("synthetic", 512, "lru"): {None: 65.1, 3_000_000: 31.5, 10_000_000: 57.7, 30_000_000: 65.1},
    ("conversation", 256, "lru"): {1_000_000: 5.53, 3_000_000: 14.23, 10_000_000: 29.46, 30_000_000: 36.60,
                                   50_000_000: 37.11, None: 37.35},
    ("synthetic", 256, "lru"): {1_000_000: 14.67, 3_000_000: 31.82, 10_000_000: 58.57, 30_000_000: 65.08,
                                50_000_000: 65.08, None: 65.08},
    ("conversation", 256, "lfu"): {3_000_000: 9.94},
    ("conversation", 256, "fifo"): {3_000_000: 13.10},
}


class Request:
    """One prompt: its length in tokens and one content id per 512-token block (``ceil(input_length / 512)``)."""

    def __init__(self, input_length: int, hash_ids: list[int]) -> None:
        assert len(hash_ids) == -(-input_length // HASH_BLOCK_TOKENS), "hash_ids must cover the prompt in 512s"
        self.input_length = input_length
        self.hash_ids = hash_ids
        self._blocks: dict[int, list[tuple[Hashable, int]]] = {}  # per chunk size: a sweep replays each many times

    def blocks(self, chunk_size: int) -> list[tuple[Hashable, int]]:
        """(key, tokens) per cached unit: the 512-token blocks, or full ``chunk_size`` chunks of them."""
        if chunk_size not in self._blocks:
            if chunk_size == HASH_BLOCK_TOKENS:
                last = self.input_length - HASH_BLOCK_TOKENS * (len(self.hash_ids) - 1)
                blocks = [(h, HASH_BLOCK_TOKENS) for h in self.hash_ids[:-1]] + [(self.hash_ids[-1], last)]
            else:
                per_block = HASH_BLOCK_TOKENS // chunk_size
                blocks = [((self.hash_ids[i // per_block], i % per_block), chunk_size)
                          for i in range(self.input_length // chunk_size)]
            self._blocks[chunk_size] = blocks
        return self._blocks[chunk_size]


def load_requests(path: Path, max_len: int | None = None) -> list[Request]:
    """The trace's requests in timestamp order (stable: ties keep file order); with ``max_len``, only those whose
    prompt and output fit in it (the ones a server of that max model length accepts)."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows.sort(key=lambda row: row["timestamp"])
    return [Request(row["input_length"], row["hash_ids"]) for row in rows
            if max_len is None or row["input_length"] + row["output_length"] <= max_len]


class LRUCache:
    """Least recently used: hits and re-inserts move a key to the young end; the old end is evicted."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.keys: OrderedDict[Hashable, None] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.keys

    def touch(self, key: Hashable) -> None:
        if key in self.keys:
            self.keys.move_to_end(key)
            return
        if self.capacity is not None and len(self.keys) >= self.capacity:
            self.keys.popitem(last=False)
        self.keys[key] = None


class FIFOCache(LRUCache):
    """First in, first out: a hit changes nothing; the oldest insert is evicted."""

    def touch(self, key: Hashable) -> None:
        if key not in self.keys:
            super().touch(key)


class LFUCache:
    """Least frequently used: a key's count starts at 1 and grows by one per touch; evict the lowest count, the
    oldest to reach it first (LMCache's LFUCachePolicy: a dict per count, FIFO inside). ``lowest`` is the smallest
    count held: a new key makes it 1, and a touch empties its bucket only by moving that key one count up."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.counts: dict[Hashable, int] = {}
        # OrderedDict, not dict: evicting from a plain dict's front leaves holes that every next(iter()) rescans
        self.keys_by_count: dict[int, OrderedDict[Hashable, None]] = {}
        self.lowest = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self.counts

    def _remove(self, key: Hashable) -> int:
        count = self.counts.pop(key)
        del self.keys_by_count[count][key]
        if not self.keys_by_count[count]:
            del self.keys_by_count[count]
            if count == self.lowest:
                self.lowest += 1
        return count

    def _add(self, key: Hashable, count: int) -> None:
        self.counts[key] = count
        if count not in self.keys_by_count:
            self.keys_by_count[count] = OrderedDict()
        self.keys_by_count[count][key] = None
        self.lowest = min(self.lowest, count) if len(self.counts) > 1 else count

    def touch(self, key: Hashable) -> None:
        if key in self.counts:
            self._add(key, self._remove(key) + 1)
            return
        if self.capacity is not None and len(self.counts) >= self.capacity:
            self._remove(next(iter(self.keys_by_count[self.lowest])))
        self._add(key, 1)


CACHES = {"lru": LRUCache, "lfu": LFUCache, "fifo": FIFOCache}


def hit_rate(requests: Iterable[Request], capacity_tokens: int | None, chunk_size: int = HASH_BLOCK_TOKENS,
             policy: str = "lru") -> float:
    """Share of prompt tokens found as a cached prefix; the cache holds ``capacity_tokens // chunk_size`` units
    (None: unlimited)."""
    assert HASH_BLOCK_TOKENS % chunk_size == 0, "a chunk must split the 512-token hash blocks evenly"
    cache = CACHES[policy](None if capacity_tokens is None else capacity_tokens // chunk_size)
    hit_tokens = prompt_tokens = 0
    for request in requests:
        prompt_tokens += request.input_length
        blocks = request.blocks(chunk_size)
        for key, tokens in blocks:
            if key not in cache:
                break
            hit_tokens += tokens
        for key, _ in blocks:
            cache.touch(key)
    return hit_tokens / prompt_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder of mooncake_*_trace.jsonl")
    args = parser.parse_args()
    requests = {}
    print(f"{'trace':<13} {'chunk':>5} {'policy':<6} {'capacity':>10} {'published %':>12} {'reference %':>12}")
    for (trace, chunk_size, policy), figures in PUBLISHED.items():
        if trace not in requests:
            requests[trace] = load_requests(args.traces / f"mooncake_{trace}_trace.jsonl")
        for capacity, published in figures.items():
            measured = 100 * hit_rate(requests[trace], capacity, chunk_size, policy)
            label = "unlimited" if capacity is None else f"{capacity / 1e6:g}M"
            digits = DECIMALS[chunk_size]
            print(f"{trace:<13} {chunk_size:>5} {policy:<6} {label:>10} {published:>12.{digits}f} {measured:>12.2f}")


if __name__ == "__main__":
    main()
