"""Issue 24's anchors with the GPU in front: ``simulate``'s GPU + host tier against LMCache's simulator and a plain
LRU of the same total tokens, on the Mooncake traces.

Per trace, total capacity (``--totals``, tokens) and ``--offload-policy``: one replay of the trace at its own
arrival times under ``paged`` with prefix caching (Qwen3-8B on one H200, its default KV of 749,504 tokens, v1; a
host tier making up the total, LRU), and prints the prompt tokens (%) found by the GPU, **loaded** from the host
tier, and **found** there (loaded + found but recomputed: LMCache's simulator has no link and no load-or-recompute
decision, so *found* is the figure counted like its own), each summed with the GPU's; beside them
``lru_reference``'s LMCache figure (256-token chunks) and plain LRU (512-token blocks) of the same total, the
mean and p99 TTFT, output tokens/s, the stores the link dropped and the replay's CPU seconds. ``--gpu-only``
replays instead with the whole total on the GPU. One JSON line per replay with ``--jsonl``.

    python -m benchmarks.host_tier_anchors [--traces DIR] [--trace conversation|synthetic] [--totals 1M,3M,10M,30M]
        [--offload-policy write-through,on-eviction] [--gpu-only] [--limit N] [--jsonl PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from benchmarks.lru_reference import TRACES, hit_rate, load_requests
from benchmarks.replay_cpu import default_config
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.readers import load_trace

MAX_MODEL_LEN = 131_072  # the Mooncake traces' longest prompts exceed Qwen3-8B's default 40,960


def tokens(text: str) -> int:
    """``3M`` -> 3,000,000 (the issue's capacities are decimal millions of tokens)."""
    return int(float(text.removesuffix("M")) * 1_000_000) if text.endswith("M") else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--trace", default="conversation", choices=("conversation", "synthetic"))
    parser.add_argument("--totals", default="1M,3M,10M,30M")
    parser.add_argument("--offload-policy", default="write-through,on-eviction")
    parser.add_argument("--gpu-only", action="store_true", help="the whole total on the GPU, no host tier")
    parser.add_argument("--limit", type=int, default=None, help="the first N requests (default: all)")
    parser.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per replay")
    args = parser.parse_args()

    path = args.traces / f"mooncake_{args.trace}_trace.jsonl"
    trace = load_trace(path, limit=args.limit)
    requests = load_requests(path)[:args.limit]
    base = default_config(MAX_MODEL_LEN, prefix_caching=True, scheduler="v1")
    gpu_tokens = base.num_blocks * base.block_size
    policies = ["none"] if args.gpu_only else args.offload_policy.split(",")
    print(f"{trace.name}: {trace.num_requests:,} requests; GPU KV {gpu_tokens:,} tokens (% of prompt tokens)")
    print(f"{'total':>6} {'policy':<13} {'GPU':>6} {'host ld':>7} {'host fd':>7} {'sum ld':>6} {'sum fd':>6} "
          f"{'LMCache':>7} {'LRU512':>6} {'TTFT mean':>9} {'TTFT p99':>9} {'tok/s':>5} {'dropped':>8} {'cpu s':>6}")
    for total in args.totals.split(","):
        capacity = tokens(total)
        lmcache, lru = (100 * hit_rate(requests, capacity, chunk) for chunk in (256, 512))
        for policy in policies:
            if args.gpu_only:
                config = dataclasses.replace(base, num_blocks=capacity // base.block_size)
            else:
                config = dataclasses.replace(base, cpu_kv_blocks=(capacity - gpu_tokens) // base.block_size,
                                             offload_policy=policy)
            start = time.process_time()
            metrics = replay(trace, config, "paged")
            cpu = time.process_time() - start
            gpu = metrics.prefix_cache_hit_pct
            host = metrics.tiers.get("cpu")
            loaded = host.hit_pct if host else 0.0
            found = loaded + 100 * host.recomputed_tokens / metrics.prefix_cache_queries if host else 0.0
            row = {"trace": args.trace, "total_tokens": capacity, "gpu_tokens": config.num_blocks * config.block_size,
                   "offload_policy": policy, "gpu_hit_pct": gpu, "host_loaded_pct": loaded, "host_found_pct": found,
                   "sum_loaded_pct": gpu + loaded, "sum_found_pct": gpu + found, "lmcache_pct": lmcache,
                   "lru512_pct": lru, "ttft_mean_s": metrics.mean_ttft_s, "ttft_p99_s": metrics.p99_ttft_s,
                   "output_tokens_per_s": metrics.throughput_tokens_per_s,
                   "dropped_stores": host.dropped_stores if host else 0, "cpu_s": cpu}
            print(f"{total:>6} {policy:<13} {gpu:>6.2f} {loaded:>7.2f} {found:>7.2f} {gpu + loaded:>6.2f} "
                  f"{gpu + found:>6.2f} {lmcache:>7.2f} {lru:>6.2f} {metrics.mean_ttft_s:>9.1f} "
                  f"{metrics.p99_ttft_s:>9.1f} {metrics.throughput_tokens_per_s:>5.0f} {row['dropped_stores']:>8,} "
                  f"{cpu:>6.1f}", flush=True)
            if args.jsonl is not None:
                with open(args.jsonl, "a") as out:
                    out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
