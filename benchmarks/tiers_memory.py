"""Whether the memory of the prefix cache's tiers grows with the blocks they hold, not with their capacity or the
trace (issue 24: "memory linear in blocks").

Replays the first ``--limit`` Mooncake conversation requests under ``paged`` with prefix caching (Qwen3-8B on one
H200, ``minipaged simulate``'s defaults) under ``tracemalloc`` and measures per run the Python heap the replay
still holds at its end (the replay object alive: its pool, its tiers) and the heap's peak, each less the same
figure of the run without tiers on the same GPU pool, measured in the same invocation:

- **Tiers.** A host tier of ``--base`` x 1, 2, 4, 8 and 64 blocks, each with a disk tier of twice that (write-through,
  LRU), then ARC and on-eviction at x2; per run the hashes the stores keep (their own count: stored blocks, and
  ARC's ghosts) and the bytes per kept hash. Linear: about the same bytes per hash at every capacity, and a
  capacity never filled (x64) costing what the blocks held cost, nothing per empty slot.
- **The GPU pool.** Without tiers, pools of ``--gpu`` x the default KV's blocks: the heap per block the pool ever
  handed out (``FreeBlockQueue.num_touched``) against the smallest pool; a pool far larger than what the trace
  touches must cost what the touched blocks cost (untouched blocks are a counter).

``tracemalloc`` counts Python's allocations only, at several times the replay's CPU time: the counts are exact,
the seconds are not the replay's speed (``tiers_bench.py`` times it).

    python -m benchmarks.tiers_memory [--traces DIR] [--limit N] [--base BLOCKS] [--gpu 0.25,1,4,256]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import tracemalloc
from pathlib import Path

from benchmarks.replay_cpu import default_config
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Trace


@dataclasses.dataclass(frozen=True)
class Heap:
    """One replay's Python heap (bytes): held at its end, and at its peak."""

    held: int
    peak: int
    run: Replay


def measured(trace: Trace, config: SimConfig) -> Heap:
    """Replay ``trace`` under ``tracemalloc``; the heap it holds at the end (the replay kept) and at its peak."""
    gc.collect()
    tracemalloc.start()
    run = Replay(trace, config, config.allocator("paged"), True, None)
    run.run()
    gc.collect()  # (what is left is what the replay holds, not cycles awaiting collection)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return Heap(held, peak, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    parser.add_argument("--trace", default="mooncake_conversation_trace.jsonl")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--base", type=int, default=20_000, help="the smallest host tier, in blocks")
    parser.add_argument("--gpu", default="0.25,1,4,256", help="GPU pools, as multiples of the default KV's blocks")
    args = parser.parse_args()

    trace = load_trace(args.traces / args.trace).limited(args.limit)
    base = default_config(131072, prefix_caching=True, scheduler="v1")  # prompts up to 126k tokens
    print(f"{trace.name}: {trace.num_requests:,} requests, GPU KV {base.cache.num_blocks:,} blocks of "
          f"{base.block_size}; "
          "Python heap (tracemalloc) less the run without tiers on the same GPU pool")
    measured(trace, base)  # (once first: what a replay allocates once and keeps, e.g. caches, is not a tier's)
    without = measured(trace, base)

    print(f"\n{'host blocks':>11} {'disk blocks':>11} {'policy':>22} {'kept hashes':>11} {'output names':>12} "
          f"{'held MB':>8} {'B/hash':>6} {'peak MB':>8} {'B/hash':>6}")
    per_hash = []
    runs = [(factor, "write-through", "lru") for factor in (1, 2, 4, 8, 64)]
    runs += [(2, "write-through", "arc"), (2, "on-eviction", "lru")]
    for factor, policy, eviction in runs:
        config = base.with_settings(cpu_kv_blocks=factor * args.base, disk_kv_blocks=2 * factor * args.base,
                                    offload_policy=policy, tier_eviction=eviction)
        heap = measured(trace, config)
        tiers = heap.run.tiers
        kept = sum(tier.store.num_kept_hashes for tier in tiers.tiers)
        held, peak = heap.held - without.held, heap.peak - without.peak
        if kept:  # (a short --limit may store nothing)
            per_hash.append(held / kept)
        held_per, peak_per = (f"{held / kept:.0f}", f"{peak / kept:.0f}") if kept else ("-", "-")
        tiers_set = config.tiers
        print(f"{tiers_set.cpu_kv_blocks:>11,} {tiers_set.disk_kv_blocks:>11,} {policy + ', ' + eviction:>22} "
              f"{kept:>11,} "
              f"{len(tiers.output_hashes):>12,} {held / 1e6:>8.1f} {held_per:>6} {peak / 1e6:>8.1f} {peak_per:>6}")
    if per_hash:
        print(f"bytes held per kept hash: {min(per_hash):.0f} to {max(per_hash):.0f}")

    print(f"\n{'GPU blocks':>11} {'touched':>9} {'cached':>9} {'held MB':>8} {'B/touched block over the first':>31}")
    first: tuple[int, int] | None = None
    for factor in (float(value) for value in args.gpu.split(",")):
        config = base.with_settings(num_blocks=round(factor * base.cache.num_blocks))
        heap = measured(trace, config)
        pool = heap.run.allocator.manager.pool
        touched = pool.free_blocks.num_touched
        first = first or (touched, heap.held)
        extra = f"{(heap.held - first[1]) / (touched - first[0]):.0f}" if touched > first[0] else "-"
        print(f"{config.cache.num_blocks:>11,} {touched:>9,} {len(pool.cached_blocks):>9,} {heap.held / 1e6:>8.1f} "
              f"{extra:>31}")


if __name__ == "__main__":
    main()
