"""What host and disk tiers under the prefix cache cost the simulator, and what they buy on the Mooncake trace.

Replays the Mooncake conversation trace under ``paged`` with prefix caching (Qwen3-8B on one H200, its default KV,
``minipaged simulate``'s defaults), without tiers and with each host tier of ``--cpu`` (the last one also with the
disk tier of ``--disk``), and prints per run its CPU seconds (``time.process_time``: on a shared machine wall
time measures the neighbours), the best of ``--repeat`` runs taken in turns (each round starts with another run,
so none always inherits a warm or a quiet spell), its ratio to the run without tiers (issue 24's goal: within
2x), the prefix hits (GPU, host, disk, as % of prompt tokens), mean TTFT and output throughput.

``--baseline-path DIR`` also times the run without tiers under another checkout (a ``git worktree`` of an older
commit: issue 24's "today's prefix-caching run" is 673c112's, the commit the tiers were built on), each replay in a
fresh process (``replay_cpu.py``), taken in turns with the others, and prints every run's ratio to it as well:
the replay without tiers has since become faster (hspeed4's block pool), so the two ratios differ.

``--profile N`` replays the last run once more under ``cProfile`` and prints its N functions of most own time.

    python -m benchmarks.tiers_bench [--traces DIR] [--limit N] [--cpu 64GiB,256GiB,1TiB] [--disk 4TiB] [--repeat N]
        [--profile N] [--baseline-path DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

from benchmarks.replay_cpu import commit_of, cpu_seconds, default_config
from minipaged_cli.sim.kv_sizing import tier_blocks
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.readers import load_trace

GOAL_RATIO = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    parser.add_argument("--trace", default="mooncake_conversation_trace.jsonl")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--cpu", default="64GiB,256GiB,1TiB")
    parser.add_argument("--disk", default="4TiB")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, taken in turns; the best CPU time counts")
    parser.add_argument("--profile", type=int, default=0, help="profile the last run: its N costliest functions")
    parser.add_argument("--baseline-path", type=Path, help="another checkout whose run without tiers to time too")
    args = parser.parse_args()

    trace = load_trace(args.traces / args.trace).limited(args.limit)
    base = default_config(131072, prefix_caching=True, scheduler="v1")  # prompts up to 126k tokens
    sizes = [size for size in args.cpu.split(",") if size]
    runs = [("none", "none", base)]
    for index, size in enumerate(sizes):
        disk = args.disk if index == len(sizes) - 1 else "0"
        runs.append((size, disk, base.with_settings(
            cpu_kv_blocks=tier_blocks(size, base.model, base.block_size, "--cpu", hybrid=base.cache.hybrid_kv),
            disk_kv_blocks=tier_blocks(disk, base.model, base.block_size, "--disk", hybrid=base.cache.hybrid_kv))))
    print(f"{trace.name}: {trace.num_requests:,} requests, KV {base.cache.num_blocks:,} blocks of {base.block_size}")
    best = [float("inf")] * len(runs)
    results = {}
    baseline_s = float("inf")
    turns = len(runs) + (args.baseline_path is not None)  # the baseline's turn is index len(runs)
    for repeat in range(args.repeat):
        for index in (*range(repeat % turns, turns), *range(repeat % turns)):
            if index == len(runs):
                baseline_s = min(baseline_s, cpu_seconds(args.baseline_path.resolve(), args.traces / args.trace,
                                                         trace.num_requests, base.max_model_len, True, "v1"))
                continue
            start = time.process_time()
            results[index] = replay(trace, runs[index][2], "paged")
            best[index] = min(best[index], time.process_time() - start)
    print(f"{'host':>8} {'disk':>6} {'cpu s':>8} {'ratio':>6} {'GPU hit %':>9} {'host %':>7} {'disk %':>7} "
          f"{'TTFT s':>9} {'out tok/s':>9}   (best of {args.repeat})")
    for index, (host, disk, _) in enumerate(runs):
        metrics = results[index]
        tiers = {name: tier.hit_pct for name, tier in metrics.tiers.items()}
        print(f"{host:>8} {disk:>6} {best[index]:>8.1f} {best[index] / best[0]:>5.2f}x "
              f"{metrics.prefix_cache_hit_pct:>9.1f} {tiers.get('cpu', 0.0):>7.1f} {tiers.get('disk', 0.0):>7.1f} "
              f"{metrics.mean_ttft_s:>9.1f} {metrics.throughput_tokens_per_s:>9.0f}")
    print(f"bound: every run within {GOAL_RATIO:g}x of the run without tiers (CPU seconds)")
    if args.baseline_path is not None:
        print(f"the run without tiers under {args.baseline_path} ({commit_of(args.baseline_path)}), in a fresh "
              f"process: {baseline_s:.1f} s")
        for index, (host, disk, _) in enumerate(runs[1:], start=1):
            ratio = best[index] / baseline_s
            verdict = "within" if ratio <= GOAL_RATIO else "NOT within"
            print(f"{host:>8} {disk:>6} {best[index]:>8.1f} s: {ratio:.2f}x of it ({verdict} {GOAL_RATIO:g}x)")
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(replay, trace, runs[-1][2], "paged")
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
