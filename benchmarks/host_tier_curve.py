"""Mooncake's Fig. 9 with a GPU in front: prompt-token hits and TTFT against the size of the host tier, beside a plain
LRU of the same total capacity.

Runs ``minipaged sweep``'s library on a Mooncake trace (Poisson arrivals at ``--rate``, the trace's order kept;
Qwen3-8B on one H200, the GPU's default KV, prefix caching, vLLM v1) at each ``--cpu-kv-memory``, one curve per
``--curves`` entry (``offload policy:tier eviction``); then replays the same requests through
``lru_reference.hit_rate`` (512-token hash blocks, timestamp order, nothing in flight) with the GPU's and the
host's tokens as one capacity. Prints one row per point and draws the picture (``--plot``). Without a host tier
(``0``) the policies do nothing: that point is replayed once and shared by every curve.

    python -m benchmarks.host_tier_curve [--trace PATH] [--limit N] [--rate R] [--cpu-kv-memory 0,64GiB,...]
        [--curves write-through:lru,write-through:arc,on-eviction:lru] [--workers N] [--plot PNG] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from benchmarks.lru_reference import TRACES, hit_rate, load_requests
from minipaged_cli.apps.sweep import Axes, SweepResult, sweep
from minipaged_cli.apps.sweep_points import Settings, prepare
from minipaged_cli.apps.sweep_runners import LocalRunner
from minipaged_cli.cli.plot import plot_host_tier
from minipaged_cli.workloads.readers import load_trace

MAX_MODEL_LEN = 131_072  # the Mooncake traces' longest prompts exceed Qwen3-8B's default 40,960


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACES / "mooncake_conversation_trace.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="the first N requests (default: all)")
    parser.add_argument("--rate", type=float, default=1.5, help="requests/s (Poisson)")
    parser.add_argument("--cpu-kv-memory", default="0,64GiB,256GiB,1TiB,4TiB")
    parser.add_argument("--curves", default="write-through:lru,write-through:arc,on-eviction:lru",
                        help="offload policy:tier eviction, one curve each")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    trace = load_trace(args.trace, limit=args.limit)
    sizes = tuple(args.cpu_kv_memory.split(","))
    curves = [tuple(curve.split(":")) for curve in args.curves.split(",")]
    settings = Settings(engine={"max_model_len": MAX_MODEL_LEN})
    rows, configs, start = {}, {}, time.perf_counter()
    no_tier = None  # the first curve's point without a host tier, which every other curve shares
    for policy, eviction in curves:
        axes = Axes(rates=(args.rate,), strategies=("paged",), prefix_caching=(True,),
                    cpu_kv_memory=tuple(size for size in sizes if size != "0" or no_tier is None),
                    offload_policies=(policy,), tier_evictions=(eviction,))
        work = prepare(trace, settings, axes.points())
        rows.update(sweep(trace, axes, settings, LocalRunner(args.workers), work=work).rows)
        configs.update({point: work.configs[point.curve] for point in axes.points()})
        if no_tier is None:
            no_tier = next((point for point in axes.points() if point.cpu_kv_memory == "0"), False)
        elif no_tier:
            shared = dataclasses.replace(no_tier, offload_policy=policy, tier_eviction=eviction)
            rows[shared], configs[shared] = rows[no_tier], configs[no_tier]
    wall = time.perf_counter() - start
    result = SweepResult(Axes(rates=(args.rate,), strategies=("paged",), prefix_caching=(True,), cpu_kv_memory=sizes,
                              offload_policies=tuple(dict.fromkeys(p for p, _ in curves)),
                              tier_evictions=tuple(dict.fromkeys(e for _, e in curves))), settings, rows)

    requests = load_requests(args.trace)[:args.limit]
    reference: dict[str, float] = {}
    replays = len(rows) - (len(curves) - 1 if no_tier else 0)
    print(f"{trace.name}: {trace.num_requests} requests at {args.rate:g}/s; {replays} replays in {wall:.0f} s")
    print(f"{'host':>7} {'policy':<25} {'GPU+host tokens':>15} {'GPU %':>6} {'host %':>6} {'sum %':>6} "
          f"{'LRU %':>6} {'TTFT mean s':>11} {'TTFT p99 s':>10}")
    for point in sorted(result.rows, key=lambda p: p.sort_key()):
        config = configs[point]
        tokens = config.kv_capacity_tokens + config.tiers.cpu_kv_blocks * config.block_size
        if point.cpu_kv_memory not in reference:
            reference[point.cpu_kv_memory] = 100 * hit_rate(requests, tokens)
        row = result.rows[point]
        print(f"{point.cpu_kv_memory:>7} {point.offload_policy + ', ' + point.tier_eviction:<25} {tokens:>15,} "
              f"{row['prefix_cache_hit_pct']:>6.2f} {row['tier_hit_pct']:>6.2f} "
              f"{row['prefix_cache_hit_pct'] + row['tier_hit_pct']:>6.2f} {reference[point.cpu_kv_memory]:>6.2f} "
              f"{row['ttft_mean_s']:>11.2f} {row['ttft_p99_s']:>10.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({**result.to_dict(), "lru_reference_pct": reference}, indent=1))
    if args.plot is not None:
        plot_host_tier(result, args.plot, reference=reference,
                       title=f"{trace.name} ({trace.num_requests} requests at {args.rate:g}/s), qwen3-8b on one "
                             "h200: prefix-cache hits and TTFT against host memory")


if __name__ == "__main__":
    main()
