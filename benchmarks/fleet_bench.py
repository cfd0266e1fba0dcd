"""The fleet's cost grows with the requests, not with the replicas: the Mooncake conversation trace on 16 replicas
of ``--kv-memory`` each against the same trace on one replica with 16x that KV memory. Goal: the fleet within 2x of
the single replica's CPU time (``time.process_time``, the best of ``--repeat`` runs of each, alternating, so that
load from other processes weighs on both alike).

    python benchmarks/fleet_bench.py [--trace FILE] [--limit N] [--replicas 16] [--kv-memory 16GiB]
        [--router prefix-aware] [--repeat 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from minipaged_cli.fleet.config import FleetConfig, ReplicaPool, RouterConfig
from minipaged_cli.fleet.fleet import run_fleet
from minipaged_cli.sim.config import DEFAULT_BLOCK_SIZE, SimConfig, num_blocks_for_memory
from minipaged_cli.units import parse_bytes
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace

GOAL_RATIO = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces"
                        / "mooncake_conversation_trace.jsonl")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--kv-memory", default="16GiB", help="each replica's; the single replica has N times it")
    parser.add_argument("--router", default="prefix-aware")
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the best counts")
    args = parser.parse_args()
    model, gpu = load_model("qwen3-8b"), load_gpu("h200")
    trace = load_trace(args.trace, "auto", limit=args.limit)
    blocks = num_blocks_for_memory(parse_bytes(args.kv_memory), model, DEFAULT_BLOCK_SIZE)

    def fleet(num_replicas: int, num_blocks: int) -> FleetConfig:
        config = SimConfig.of(model, gpu, num_blocks=num_blocks, max_model_len=args.max_model_len)
        return FleetConfig((ReplicaPool("replicas", num_replicas, config),), RouterConfig(args.router))

    runs = {"fleet": fleet(args.replicas, blocks), "single": fleet(1, blocks * args.replicas)}
    best = dict.fromkeys(runs, float("inf"))
    done = {}
    for _ in range(args.repeat):
        for name, spec in runs.items():
            start = time.process_time()
            done[name] = run_fleet(trace, spec).to_dict()["completed_requests"]
            best[name] = min(best[name], time.process_time() - start)
    ratio = best["fleet"] / best["single"]
    print(f"{trace.num_requests} requests ({trace.name}); {args.replicas} replicas of {args.kv_memory}, router "
          f"{args.router}: {best['fleet']:.2f} s CPU ({done['fleet']} completed); one replica of "
          f"{args.replicas} x {args.kv_memory}: {best['single']:.2f} s CPU ({done['single']} completed)")
    print(f"ratio {ratio:.2f} (goal <= {GOAL_RATIO:g}): {'met' if ratio <= GOAL_RATIO else 'NOT met'}")


if __name__ == "__main__":
    main()
