"""Sessions must not slow the replay down: generated chat sessions (10 turns each, a shared system prompt, think
times) replayed with their turns sent as answers come back, against the same turns flattened into open-loop
requests arriving when the sessions sent them (the same steps and hits: ``tests/workloads/test_sessions.py`` checks that
equality; here only the time differs). Goal: within 1.5x.

    python benchmarks/sessions_bench.py            # 200 sessions x 10 turns (well under a minute)
    python benchmarks/sessions_bench.py --full     # 2,000 sessions x 10 turns, the issue's size
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.session_yaml import generate_sessions
from minipaged_cli.workloads.trace import Trace, make_trace

GOAL = 1.5


def chat_sessions(count: int, turns: int, seed: int) -> Trace:
    """``count`` sessions of ``turns`` turns, starting as a Poisson process sized to keep a GPU busy."""
    group = {"count": count, "seed": seed, "arrival": {"process": "poisson", "rate_per_s": count / 600},
             "turns": {"dist": "constant", "value": turns},
             "delay_s": {"dist": "lognormal", "median": 5.0, "sigma": 0.6},
             "prompt_tokens": {"dist": "lognormal", "median": 250, "sigma": 0.8, "max": 4000},
             "output_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.7, "max": 1500},
             "prefix": ["system"]}
    return make_trace(f"chat-{count}x{turns}", [], source="sessions_bench", segments={"system": 1200},
                      sessions=generate_sessions(group, 0, "sessions_bench"))


def timed_replay(trace: Trace, config: SimConfig) -> tuple[float, Replay]:
    replay = Replay(trace, config, config.allocator("paged"), True, None)
    start = time.perf_counter()
    replay.run()
    return time.perf_counter() - start, replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="2,000 sessions (default 200)")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trace = chat_sessions(2000 if args.full else 200, args.turns, args.seed)
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=60_000, max_model_len=40_960)
    sessions_s, replay = timed_replay(trace, config)
    sent = replay.scheduler.arrivals.sent_s
    flat = Trace(trace.name, tuple(sorted((replace(r, arrival_s=t) for r, t in zip(trace.requests, sent, strict=True)),
                                          key=lambda r: r.arrival_s)), trace.segments)
    flat_s, flat_replay = timed_replay(flat, config)
    metrics, flat_metrics = replay.accounting, flat_replay.accounting
    same = (metrics.prefix_cache_hits, metrics.num_steps) == (flat_metrics.prefix_cache_hits, flat_metrics.num_steps)
    print(f"{trace.name}: {trace.num_requests:,} turns, {metrics.num_steps:,} steps, prefix hits "
          f"{metrics.prefix_cache_hits:,} of {metrics.prefix_cache_queries:,} tokens (flat: the same: {same})")
    print(f"sessions {sessions_s:.2f} s, flat {flat_s:.2f} s: ratio {sessions_s / flat_s:.2f}x (goal <= {GOAL}x)")


if __name__ == "__main__":
    main()
