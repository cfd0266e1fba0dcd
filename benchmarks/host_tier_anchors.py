"""Issue 24's anchors with the GPU in front: ``simulate``'s GPU + host tier against LMCache's simulator and a plain
LRU of the same total tokens, on the Mooncake traces.

Per trace, total capacity (``--totals``, tokens) and ``--offload-policy``: one replay of the trace at its own
arrival times under ``paged`` with prefix caching (Qwen3-8B on one H200, its default KV of 749,504 tokens, v1; a
host tier making up the total, LRU), and prints the prompt tokens (%) found by the GPU, **loaded** from the host
tier, and **found** there (loaded + found but recomputed: LMCache's simulator has no link and no load-or-recompute
decision, so *found* is the figure counted like its own), each summed with the GPU's; beside them
``lru_reference``'s LMCache figure (256-token chunks; *LMC srv*: over the requests the server accepts, those
that fit in ``MAX_MODEL_LEN``, 3,983 of the synthetic trace's 3,993) and plain LRU (512-token blocks) of the same
total, the mean and p99 TTFT, output tokens/s, the stores the tier had no room for, the seconds the stores' copies took
from their issue (summed: a bound on what evictions that wait for their copy would add), and the replay's CPU
seconds. ``--gpu-only`` replays instead with the whole total on the GPU; ``--tier-inclusion exclusive`` (with
``--offload-policy on-eviction``) with a host tier that gives up the blocks the GPU caches (``simulate
--tier-inclusion``). ``--time-scales 1,10`` replays each row
at each pace: arrival times multiplied by it (``minipaged simulate --time-scale``), 1 the trace's own (one H200
falls behind the synthetic trace: requests queue), 10 one where it keeps up (the cache's own figure, as
LMCache's simulator and Mooncake's Fig. 9 replay count it: no queue). ``--both-tiers`` samples, every thousandth
of the trace's arrival span of simulated time, how many blocks the GPU's prefix cache and the host tier hold
both: the capacity the two tiers spend on one block. One JSON line per replay with ``--jsonl``.

    python -m benchmarks.host_tier_anchors [--traces DIR] [--trace conversation|synthetic] [--totals 1M,3M,10M,30M]
        [--offload-policy write-through,on-eviction] [--tier-inclusion inclusive|exclusive] [--gpu-only]
        [--time-scales 1,10] [--both-tiers]
        [--limit N] [--jsonl PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import TracebackType

from benchmarks.lru_reference import TRACES, Request, hit_rate, load_requests
from benchmarks.replay_cpu import default_config
from minipaged_cli.sim.replay import replay
from minipaged_cli.sim.settings import TIER_INCLUSIONS
from minipaged_cli.sim.tiers import TieredCache
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Trace

MAX_MODEL_LEN = 131_072  # the Mooncake traces' longest prompts exceed Qwen3-8B's default 40,960


def served_requests(path: Path, trace: Trace) -> list[Request]:
    """The requests of ``trace`` (the trace's first ones, as replayed) that a server of ``MAX_MODEL_LEN`` accepts:
    the first of all accepted ones, as many as the trace holds (filtering keeps the order)."""
    num_served = sum(request.prompt_tokens + request.output_tokens <= MAX_MODEL_LEN for request in trace.requests)
    return load_requests(path, MAX_MODEL_LEN)[:num_served]


def tokens(text: str) -> int:
    """``3M`` -> 3,000,000 (the issue's capacities are decimal millions of tokens)."""
    return int(float(text.removesuffix("M")) * 1_000_000) if text.endswith("M") else int(text)


class TierWatch:
    """While open with ``num_samples``, every ``TieredCache.flush`` (a step's end) is watched: the blocks the GPU's
    prefix cache and the host tier hold both counted every ``span_s / num_samples`` seconds of simulated time (at the
    first step's end after each); without samples the replay runs as it is."""

    def __init__(self, span_s: float, num_samples: int) -> None:
        self.every_s = span_s / num_samples if num_samples else None
        self.next_s = 0.0
        self.samples: list[tuple[int, int, int]] = []  # (GPU cached blocks, host blocks, held in both)

    def __enter__(self) -> TierWatch:
        if self.every_s is None:
            return self
        every_s = self.every_s
        self.flush = flush = TieredCache.flush

        def watched(cache: TieredCache, now: float, **options: bool) -> list:
            if now >= self.next_s and cache.pool is not None:
                self.next_s = now + every_s
                cache.end_loads(now)  # (as the flush does first: a block loaded by now has left an exclusive tier)
                host = cache.tiers[0].store
                gpu, _, _ = cache.pool.keyed_cache()  # (keys as the tiers name them)
                self.samples.append((len(gpu), len(host), sum(map(host.contains, gpu))))
            return flush(cache, now, **options)

        TieredCache.flush = watched  # type: ignore[method-assign]
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.every_s is not None:
            TieredCache.flush = self.flush  # type: ignore[method-assign]

    def mean(self, column: int) -> float:
        return sum(sample[column] for sample in self.samples) / len(self.samples) if self.samples else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--trace", default="conversation", choices=("conversation", "synthetic"))
    parser.add_argument("--totals", default="1M,3M,10M,30M")
    parser.add_argument("--offload-policy", default="write-through,on-eviction")
    parser.add_argument("--tier-inclusion", default="inclusive", choices=TIER_INCLUSIONS,
                        help="exclusive: the tiers give up what the GPU caches (needs --offload-policy on-eviction)")
    parser.add_argument("--gpu-only", action="store_true", help="the whole total on the GPU, no host tier")
    parser.add_argument("--time-scales", default="1", help="arrival times multiplied by each (10: no queue)")
    parser.add_argument("--both-tiers", action="store_true", help="sample the blocks held in GPU and host at once")
    parser.add_argument("--limit", type=int, default=None, help="the first N requests (default: all)")
    parser.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per replay")
    args = parser.parse_args()

    path = args.traces / f"mooncake_{args.trace}_trace.jsonl"
    trace = load_trace(path, limit=args.limit)
    requests = load_requests(path)[:args.limit]
    served = served_requests(path, trace)
    base = default_config(MAX_MODEL_LEN, prefix_caching=True, scheduler="v1")
    gpu_tokens = base.cache.num_blocks * base.block_size
    policies = ["none"] if args.gpu_only else args.offload_policy.split(",")
    print(f"{trace.name}: {trace.num_requests:,} requests; GPU KV {gpu_tokens:,} tokens; {args.tier_inclusion} "
          "host tier (% of prompt tokens)")
    print(f"{'total':>6} {'pace':>4} {'policy':<13} {'GPU':>6} {'host ld':>7} {'host fd':>7} {'sum ld':>6} "
          f"{'sum fd':>6} {'LMCache':>7} {'LMC srv':>7} {'LRU512':>6} {'TTFT mean':>9} {'TTFT p99':>9} {'tok/s':>5} "
          f"{'dropped':>8} {'wait s':>7} {'both':>7} {'cpu s':>6}")
    for total in args.totals.split(","):
        capacity = tokens(total)
        lmcache, lru = (100 * hit_rate(requests, capacity, chunk) for chunk in (256, 512))
        lmcache_served = 100 * hit_rate(served, capacity, 256)
        for pace in map(float, args.time_scales.split(",")):
            paced = trace.time_scaled(pace)
            span_s = paced.requests[-1].arrival_s - paced.requests[0].arrival_s
            for policy in policies:
                if args.gpu_only:
                    config = base.with_settings(num_blocks=capacity // base.block_size)
                else:
                    config = base.with_settings(cpu_kv_blocks=(capacity - gpu_tokens) // base.block_size,
                                                offload_policy=policy, tier_inclusion=args.tier_inclusion)
                start = time.process_time()
                with TierWatch(span_s, 1000 if args.both_tiers else 0) as watch:
                    metrics = replay(paced, config, "paged")
                cpu = time.process_time() - start
                gpu = metrics.prefix_cache_hit_pct
                host = metrics.tiers.get("cpu")
                loaded = host.hit_pct if host else 0.0
                found = loaded + 100 * host.recomputed_tokens / metrics.prefix_cache_queries if host else 0.0
                wait = host.store_wait_s if host else 0.0
                row = {"trace": args.trace, "time_scale": pace, "total_tokens": capacity,
                       "gpu_tokens": config.cache.num_blocks * config.block_size, "offload_policy": policy,
                       "tier_inclusion": config.tiers.tier_inclusion,
                       "gpu_hit_pct": gpu, "host_loaded_pct": loaded, "host_found_pct": found,
                       "sum_loaded_pct": gpu + loaded, "sum_found_pct": gpu + found, "lmcache_pct": lmcache,
                       "lmcache_served_pct": lmcache_served, "lru512_pct": lru, "ttft_mean_s": metrics.mean_ttft_s,
                       "ttft_p99_s": metrics.p99_ttft_s,
                       "output_tokens_per_s": metrics.throughput_tokens_per_s, "makespan_s": metrics.makespan_s,
                       "dropped_stores": host.dropped_stores if host else 0, "store_wait_s": wait,
                       "gpu_cached_blocks_mean": watch.mean(0), "host_blocks_mean": watch.mean(1),
                       "both_tiers_blocks_mean": watch.mean(2), "cpu_s": cpu}
                print(f"{total:>6} {pace:>4g} {policy:<13} {gpu:>6.2f} {loaded:>7.2f} {found:>7.2f} "
                      f"{gpu + loaded:>6.2f} {gpu + found:>6.2f} {lmcache:>7.2f} {lmcache_served:>7.2f} {lru:>6.2f} "
                      f"{metrics.mean_ttft_s:>9.1f} {metrics.p99_ttft_s:>9.1f} {metrics.throughput_tokens_per_s:>5.0f} "
                      f"{row['dropped_stores']:>8,} {wait:>7.1f} {watch.mean(2):>7,.0f} {cpu:>6.1f}", flush=True)
                if args.jsonl is not None:
                    with open(args.jsonl, "a") as out:
                        out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
