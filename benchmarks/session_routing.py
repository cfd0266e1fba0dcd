"""Session affinity against precise prefix-aware routing, round-robin and the weighted router on a multi-turn chat
workload over a fleet, run through ``minipaged simulate`` and written to ``docs/studies/session-routing.md`` with
the command of every row (so each number can be reproduced by hand).

1. Open loop: the sessions' own starts and think times (a turn is sent when the answer before it came back, plus
   the user's think time).
2. Closed loop: ``--concurrency`` clients across the fleet, each starting its next session when its last is done.

    python benchmarks/session_routing.py [--trace traces/chat_sessions.yaml] [--limit N] [--out PAGE]

``--limit`` keeps the first N requests (a turn only with every turn it waits for; the document says so).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_studies import ROOT, ms, simulate

TRACE = ROOT / "traces" / "chat_sessions.yaml"
OUT = ROOT / "docs" / "studies" / "session-routing.md"
ENGINE = ["--kv-memory", "4GiB", "--replicas", "4"]
ROUTERS: tuple[tuple[str, list[str]], ...] = (
    ("round-robin", ["--router", "round-robin"]),
    ("least-loaded", ["--router", "least-loaded"]),
    ("prefix-aware, precise", ["--router", "prefix-aware"]),
    ("session-affinity", ["--router", "session-affinity"]),
    ("weighted prefix:2,queue:1,kv:1", ["--router", "weighted"]),
    ("weighted prefix:2,queue:1,kv:1,session:3",
     ["--router", "weighted", "--router-weights", "prefix:2,queue:1,kv:1,session:3"]),
)
CLOSED_LOOP = ["--concurrency", "32"]


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def study(trace: Path, clients: list[str], limit: int | None) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """One row per router: the command, and what its fleet's JSON says."""
    lines = ["| router | hit % turn 1 | hit % later turns | mean TTFT ms | p99 TTFT ms | mean session s | "
             "turns/s | imbalance | command |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    figures = {}
    for name, options in ROUTERS:
        command, fleet, _ = simulate(trace, [*ENGINE, *options, *clients], limit)
        sessions = fleet["sessions"]
        figures[name] = fleet
        lines.append(f"| {name} | {pct(sessions['hit_pct_first_turn'])} | {pct(sessions['hit_pct_later_turns'])} | "
                     f"{ms(fleet['mean_ttft_s'])} | {ms(fleet['p99_ttft_s'])} | "
                     f"{pct(sessions['mean_session_s'])} | "
                     f"{sessions['turns_per_s']:.2f} | {fleet['imbalance']:.2f} | `{command}` |")
    return lines, figures


def summary(figures: dict[str, dict[str, Any]]) -> str:
    """Which router kept conversations in cache best, and what it cost in tail latency (from the rows above)."""
    def later(name: str) -> float:
        return figures[name]["sessions"]["hit_pct_later_turns"] or 0.0

    best = max(figures, key=later)
    fastest = min(figures, key=lambda name: figures[name]["p99_ttft_s"] or float("inf"))
    base = later("round-robin")
    ratio = f"{later(best) / base:.2f}x round-robin's" if base else "round-robin finds none"
    tail = "which also has the lowest p99 TTFT" if fastest == best else (
        f"lowest p99 TTFT: {fastest} ({ms(figures[fastest]['p99_ttft_s'])} ms against "
        f"{ms(figures[best]['p99_ttft_s'])} ms)")
    return f"Highest later-turn hit rate: {best} ({pct(later(best))} %, {ratio}); {tail}."


def page(trace: Path, limit: int | None) -> str:
    open_lines, open_figures = study(trace, [], limit)
    closed_lines, closed_figures = study(trace, CLOSED_LOOP, limit)
    shown = trace.resolve().relative_to(ROOT) if trace.resolve().is_relative_to(ROOT) else trace
    scope = f"the first {limit:,} requests of `{shown}` (a bounded slice)" if limit else f"`{shown}`"
    command = "python benchmarks/session_routing.py" + (f" --limit {limit}" if limit else "")
    return "\n".join([
        "# Session affinity against prefix-aware routing",
        "",
        f"Written by `{command}` ({scope}); Qwen3-8B on H200 presets with 4 GiB of KV memory per replica (29,120 "
        "tokens: a handful of whole conversations, so the cache must choose what it keeps), 4 replicas, vLLM v1's "
        "scheduler with prefix caching; every command below reproduces its row.",
        "",
        "The workload: 200 chat sessions of 2 to 10 turns sharing a 1,000-token system prompt, each turn's prompt "
        "the whole conversation so far (earlier prompts and answers), the next turn sent a think time (median "
        "3 s) after the answer. A later turn hits the cache only on the replica that holds its conversation.",
        "",
        "The routers: `session-affinity` sends a turn to the replica that answered its session's last turn (llm-d's "
        "session-affinity scorer: a cookie names that replica, 1.0 there and 0 elsewhere; a first turn ties and "
        "goes to the least loaded); `prefix-aware` (precise) to the replica whose published KV events hold the "
        "longest prefix, among those with no queue; `weighted` sums llm-d's scorers (prefix, queue, KV usage; "
        "and in the last row the session score with weight 3). Hit %: prompt tokens found in the GPU prefix "
        "cache, of those looked up, for first turns and for later ones; a session's time runs from its first "
        "turn's send to its last turn's answer.",
        "",
        "## Open loop: the sessions' own starts and think times",
        "",
        *open_lines,
        "",
        summary(open_figures),
        "",
        "## Closed loop: 32 clients across the fleet",
        "",
        "Each client starts its next session when its last one is done (`--concurrency 32`); think times inside a "
        "session still apply.",
        "",
        *closed_lines,
        "",
        summary(closed_figures),
        "",
        "Affinity pins a conversation to the replica that answered its last turn, whatever that replica's load "
        "and whatever its cache kept; precise prefix-aware routing reads where the history is still cached and, "
        "when that replica has a queue, sends the turn elsewhere. Where the pools are too small for the "
        "conversations in flight (histories evicted during think times), no router finds much of a later turn's "
        "history; where they fit, both find most of it. A session term beside the weighted router's prefix score "
        "compounds that score's pull: first turns go where the shared system prompt is cached, and the session "
        "score keeps their conversations there (compare the two weighted rows' imbalance).",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--limit", type=int, default=None, help="the first N requests of the trace")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page(args.trace, args.limit))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
