"""How fast the simulator replays real traces.

Replays the full Azure conversation trace (19,366 requests) under all five strategies and the full Mooncake
conversation trace (12,031 requests) under ``paged``, without and with prefix caching, with the defaults of
``minipaged simulate`` (Qwen3-8B on an H200, KV = 0.9 of its memory minus the weights), and prints wall time and
simulated tokens (prompt + output) per wall-clock second. The baseline, measured in the same run: the same replay
stepping one decode step at a time (``bulk=False``) on the first requests of each trace. Goal on a 2-core machine:
the Azure run under 30 s. ``--scheduler v0`` replays with vLLM v0's scheduling (``simulate``'s default before v1),
``--strategies`` and ``--skip-mooncake`` shorten the run.

``--baseline-path DIR`` measures instead how this checkout's replay speed compares with another checkout's (a
``git worktree`` of an older commit): the same paged replays (the first ``--ratio-requests`` Azure conversation
requests, without and with prefix caching) under each, each replay in a fresh process (``replay_cpu.py``), the two
checkouts interleaved, best of ``--repeats`` in CPU seconds (``time.process_time``: on a shared, loaded machine
wall time measures the neighbours), and prints the ratio this / baseline.

    python benchmarks/simulate_bench.py [--traces DIR] [--baseline-requests N] [--scheduler v1|v0]
    python benchmarks/simulate_bench.py --baseline-path DIR [--ratio-requests N] [--repeats N] [--scheduler v1|v0]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from replay_cpu import commit_of, cpu_seconds, default_config

from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import replay
from minipaged_cli.sim.settings import SCHEDULERS
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Trace

GOAL_S = 30.0
CHECKOUT = Path(__file__).resolve().parents[1]
RATIO_GOAL = 1.10  # issue 21: replay speed within 10 % of the replay before v1's scheduling


def timed(trace: Trace, config: SimConfig, strategy: str, bulk: bool = True) -> tuple[float, float]:
    """(wall seconds, simulated tokens per wall second)."""
    start = time.perf_counter()
    metrics = replay(trace, config, strategy, bulk=bulk)
    wall = time.perf_counter() - start
    served = trace.prompt_tokens + trace.output_tokens
    assert metrics.completed_requests + metrics.rejected_requests == trace.num_requests
    return wall, served / wall


def compare(baseline: Path, traces: Path, num_requests: int, repeats: int, scheduler: str) -> None:
    """Print best-of-``repeats`` CPU seconds of the same replays under ``baseline`` and this checkout."""
    trace = traces / "AzureLLMInferenceTrace_conv.csv"
    commit = commit_of(baseline)
    print(f"baseline {baseline} ({commit}); this checkout {CHECKOUT}; --scheduler {scheduler} where the checkout "
          f"has it; best of {repeats}, CPU seconds, interleaved")
    print(f"{'trace':36} {'strategy':15} {'requests':>8} {'baseline s':>10} {'this s':>8} {'ratio':>7}")
    for prefix_caching in (False, True):
        best = {baseline: float("inf"), CHECKOUT: float("inf")}
        for repeat in range(repeats):
            # Alternate which runs first, so neither always inherits the other's warm caches or quiet spell.
            for checkout in (baseline, CHECKOUT) if repeat % 2 == 0 else (CHECKOUT, baseline):
                seconds = cpu_seconds(checkout, trace, num_requests, None, prefix_caching, scheduler)
                best[checkout] = min(best[checkout], seconds)
        ratio = best[CHECKOUT] / best[baseline]
        label = "paged" + (" +prefix" if prefix_caching else "")
        verdict = "within" if ratio <= RATIO_GOAL else "NOT within"
        print(f"{trace.name:36} {label:15} {num_requests:>8,} {best[baseline]:>10.3f} {best[CHECKOUT]:>8.3f} "
              f"{ratio:>6.3f}x ({verdict} {RATIO_GOAL:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    parser.add_argument("--baseline-requests", type=int, default=500)
    parser.add_argument("--scheduler", choices=SCHEDULERS, default="v1")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="for the Azure trace")
    parser.add_argument("--skip-mooncake", action="store_true")
    parser.add_argument("--baseline-path", type=Path, help="another checkout to compare replay speed with")
    parser.add_argument("--ratio-requests", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.baseline_path is not None:
        compare(args.baseline_path.resolve(), args.traces, args.ratio_requests, args.repeats, args.scheduler)
        return

    runs = [("AzureLLMInferenceTrace_conv.csv", tuple(args.strategies.split(",")), None, False)]
    if not args.skip_mooncake:
        runs += [
            ("mooncake_conversation_trace.jsonl", ("paged",), 131072, False),  # prompts up to 126k tokens
            ("mooncake_conversation_trace.jsonl", ("paged",), 131072, True),
        ]
    print(f"{'trace':36} {'strategy':15} {'requests':>8} {'wall s':>8} {'Mtok/s':>8} "
          f"{'baseline Mtok/s':>16} {'speed-up':>9}")
    for name, strategies, max_model_len, prefix_caching in runs:
        trace = load_trace(args.traces / name)
        head = trace.limited(args.baseline_requests)
        config = default_config(max_model_len, prefix_caching, args.scheduler)
        total = 0.0
        for strategy in strategies:
            wall, rate = timed(trace, config, strategy)
            _, baseline = timed(head, config, strategy, bulk=False)
            total += wall
            label = strategy + (" +prefix" if prefix_caching else "")
            print(f"{name:36} {label:15} {trace.num_requests:>8,} {wall:>8.2f} {rate / 1e6:>8.2f} "
                  f"{baseline / 1e6:>16.3f} {rate / baseline:>8.1f}x")
        goal = f" (goal < {GOAL_S:.0f} s: {'met' if total < GOAL_S else 'NOT met'})" if len(strategies) > 1 else ""
        print(f"{name:36} {'all':15} {'':>8} {total:>8.2f}{goal}")


if __name__ == "__main__":
    main()
