"""How much faster a sweep runs in local worker processes than one point after another.

Runs the same points twice from one command: inline (``--workers 1``: one replay after another in this process)
and in a pool of worker processes (default: every core), checks that both give the same rows, and prints the
wall times and their ratio. Goal on a 2-core machine: the pool in at most 0.6 of the inline time.

    python benchmarks/sweep_bench.py [TRACE] [--rates 2,8] [--kv-memory 16GiB] [--workers N]

TRACE defaults to the full Azure conversation trace in ../shared/traces (19,366 requests: seconds a point, so
that starting the pool is a small share), else the committed 1,000-request slice.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from minipaged_cli.apps.sweep import Axes, sweep
from minipaged_cli.apps.sweep_points import Settings
from minipaged_cli.apps.sweep_runners import LocalRunner
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.workloads.readers import load_trace

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
    parser.add_argument("trace", nargs="?", default=str(shared if shared.is_file() else
                                                        ROOT / "traces" / "azure_conv_1k.yaml"))
    parser.add_argument("--rates", default="2,8")
    parser.add_argument("--kv-memory", default="16GiB")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    trace = load_trace(args.trace)
    axes = Axes(rates=tuple(float(r) for r in args.rates.split(",")), strategies=STRATEGIES,
                kv_memory=(args.kv_memory,))
    settings = Settings(engine={"max_model_len": args.max_model_len})
    points = len(axes.points())

    started = time.perf_counter()
    inline = sweep(trace, axes, settings, LocalRunner(1))
    inline_s = time.perf_counter() - started
    started = time.perf_counter()
    pooled = sweep(trace, axes, settings, LocalRunner(args.workers))
    pooled_s = time.perf_counter() - started
    assert pooled.to_dict() == inline.to_dict(), "the pool's rows differ from the inline ones"

    ratio = pooled_s / inline_s
    print(f"{trace.name}: {trace.num_requests} requests, {points} points ({len(STRATEGIES)} strategies x "
          f"{len(axes.rates)} rates), {os.cpu_count()} cores")
    print(f"one after another (inline)      {inline_s:7.2f} s")
    print(f"{args.workers} worker processes            {pooled_s:7.2f} s   (same rows)")
    print(f"ratio {ratio:.2f} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})")


if __name__ == "__main__":
    main()
