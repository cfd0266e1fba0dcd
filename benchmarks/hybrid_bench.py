"""How fast a model with sliding windows replays under the hybrid KV cache manager, against the same model with
every layer as full attention (the baseline: what the replay cost before KV cache groups) on the same trace and
KV memory. Goal: the hybrid replay within 1.5x of the baseline's wall time.

    python benchmarks/hybrid_bench.py --model configs/models/gpt-oss-120b.yaml [--trace FILE] [--limit N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from minipaged_cli.sim.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    SimConfig,
    num_blocks_for_memory,
)
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace

GOAL_RATIO = 1.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a preset or config.json with sliding-window layers")
    parser.add_argument("--trace", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces"
                        / "AzureLLMInferenceTrace_conv.csv")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=32768)
    args = parser.parse_args()
    model, gpu = load_model(args.model), load_gpu("h200")
    trace = load_trace(args.trace, "auto", limit=args.limit)
    kv_memory = int(DEFAULT_GPU_MEMORY_UTILIZATION * gpu.memory_bytes - model.weight_bytes)
    hybrid = SimConfig(model, gpu, num_blocks=num_blocks_for_memory(kv_memory, model, DEFAULT_BLOCK_SIZE),
                       max_model_len=args.max_model_len)
    seconds = {}
    for label, config in (("hybrid groups", hybrid), ("all full attention", hybrid.all_full_attention())):
        start = time.perf_counter()
        metrics = replay(trace, config, "paged")
        seconds[label] = time.perf_counter() - start
        print(f"{label:>20}: {seconds[label]:6.1f} s wall, {config.num_blocks:,} blocks, "
              f"{metrics.completed_requests:,} requests done, {metrics.throughput_tokens_per_s:,.0f} output tok/s")
    ratio = seconds["hybrid groups"] / seconds["all full attention"]
    verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
    print(f"hybrid / all-full wall time: {ratio:.2f}x (goal <= {GOAL_RATIO}x: {verdict})")


if __name__ == "__main__":
    main()
