"""How fast a model with sliding windows replays under the hybrid KV cache manager, against the same model with
every layer as full attention (the baseline: what the replay cost before KV cache groups) on the same trace and
KV memory. Goal: the hybrid replay within 1.5x of the baseline's CPU time (``time.process_time``, the best of
``--repeat`` runs of each, alternating, so that load from other processes weighs on both alike).

    python benchmarks/hybrid_bench.py --model gpt-oss-120b [--trace FILE] [--limit N] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from minipaged_cli.sim.config import DEFAULT_BLOCK_SIZE, SimConfig
from minipaged_cli.sim.kv_sizing import resolve_num_blocks
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
    parser.add_argument("--repeat", type=int, default=3, help="runs of each replay; the best counts")
    args = parser.parse_args()
    model, gpu = load_model(args.model), load_gpu("h200")
    trace = load_trace(args.trace, "auto", limit=args.limit)
    num_blocks, _, _ = resolve_num_blocks(model, gpu, DEFAULT_BLOCK_SIZE, None, None, None)  # simulate's default pool
    hybrid = SimConfig.of(model, gpu, num_blocks=num_blocks, block_size=DEFAULT_BLOCK_SIZE,
                          max_model_len=args.max_model_len)
    configs = {"hybrid groups": hybrid, "all full attention": hybrid.all_full_attention()}
    seconds, metrics = dict.fromkeys(configs, float("inf")), {}
    for _ in range(args.repeat):
        for label, config in configs.items():
            start = time.process_time()
            metrics[label] = replay(trace, config, "paged")
            seconds[label] = min(seconds[label], time.process_time() - start)
    for label, config in configs.items():
        print(f"{label:>20}: {seconds[label]:6.2f} s CPU (best of {args.repeat}), {config.cache.num_blocks:,} blocks, "
              f"{metrics[label].completed_requests:,} requests done, "
              f"{metrics[label].throughput_tokens_per_s:,.0f} output tok/s")
    ratio = seconds["hybrid groups"] / seconds["all full attention"]
    verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
    print(f"hybrid / all-full CPU time: {ratio:.2f}x (goal <= {GOAL_RATIO}x: {verdict})")


if __name__ == "__main__":
    main()
