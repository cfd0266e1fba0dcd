"""How the replay's cost grows with the trace: the Azure conversation trace repeated x1, x5 and x10.

Fleets replay big traces, so one replay must cost in proportion to its trace (issue 35): the ``paged`` replay of
the Azure conversation trace (19,366 requests) under ``simulate``'s engine (Qwen3-8B on an H200, vLLM v1's
scheduling) with 16 GiB of KV memory, the trace repeated back to back (``replay_cpu.repeated``: copy c arrives
c * (span + mean gap) later, so each copy keeps the trace's arrival pattern; 96,830 and 193,660 requests). Each
replay runs in a fresh process (``replay_cpu.py``), the sizes interleaved, best of ``--repeats`` in CPU seconds
(``time.process_time``: on a shared, loaded machine wall time measures the neighbours). Printed per size: the CPU
seconds, their ratio to x1 against the goal (x10 within 10.5x of x1: 5 % over linear; x5 within 5.25x), the
process's peak resident memory, the replay's share of it (the peak minus the memory with the trace loaded) and,
from x1 to each larger size, the replay's memory per added request (bounded: what finished requests leave behind
must not grow with them).

``--baseline-path DIR`` replays the same sizes under another checkout too (a ``git worktree`` of an older commit),
interleaved with this one's, and prints this / baseline per size. ``--markdown PATH`` writes the table for the docs.

    python benchmarks/replay_scaling.py [--traces DIR] [--copies 1,5,10] [--repeats N] [--kv-memory 16GiB]
        [--baseline-path DIR] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from replay_cpu import commit_of, measure

from minipaged_cli.units import parse_bytes

CHECKOUT = Path(__file__).resolve().parents[1]
TRACE = "AzureLLMInferenceTrace_conv.csv"
OVER_LINEAR = 1.05  # x10 within 10.5x of x1


def best_runs(checkouts: list[Path], trace: Path, copies: list[int], repeats: int,
              kv_memory: int) -> dict[tuple[int, int], dict[str, Any]]:
    """(checkout's position, copies) -> the run of least CPU time over ``repeats``, sizes and checkouts
    interleaved."""
    best: dict[tuple[int, int], dict[str, Any]] = {}
    for repeat in range(repeats):
        # Alternate the order, so that no size or checkout always runs in the same spell of the neighbours' load.
        for count in copies if repeat % 2 == 0 else copies[::-1]:
            order = list(enumerate(checkouts))
            for position, checkout in order if repeat % 2 == 0 else order[::-1]:
                run = measure(checkout, trace, 10**9, None, False, "v1", count, kv_memory)
                print(f"  run {repeat + 1}/{repeats}: {checkout.name} x{count}: {run['cpu_s']:.2f} s CPU, "
                      f"peak {run['peak_rss_mb']:.0f} MiB", file=sys.stderr, flush=True)
                if (position, count) not in best or run["cpu_s"] < best[(position, count)]["cpu_s"]:
                    best[(position, count)] = run
    return best


def replay_mb(run: dict[str, Any]) -> float:
    """The replay's share of the process's peak memory: its peak at the end over its memory with the trace
    loaded, just before the replay."""
    return run["peak_rss_mb"] - run["loaded_rss_mb"]


def table(best: dict[tuple[int, int], dict[str, Any]], labels: list[str], copies: list[int]) -> list[list[str]]:
    """Rows of strings: per checkout and size, CPU seconds and their ratio to the first size against the goal,
    memory, and (after the baseline, the first checkout) the ratio to the baseline's CPU seconds."""
    rows = []
    for position, label in enumerate(labels):
        first = best[(position, copies[0])]
        for count in copies:
            run = best[(position, count)]
            ratio = run["cpu_s"] / first["cpu_s"]
            goal = count / copies[0] * OVER_LINEAR
            verdict = f"{'within' if ratio <= goal else 'NOT within'} {goal:.2f}x" if count != copies[0] else ""
            added = run["requests"] - first["requests"]
            per_request = f"{(replay_mb(run) - replay_mb(first)) * 2**20 / added:,.0f}" if added else ""
            versus = f"{run['cpu_s'] / best[(0, count)]['cpu_s']:.3f}x" if position else ""
            rows.append([label, f"x{count}", f"{run['requests']:,}", f"{run['cpu_s']:.2f}", f"{ratio:.2f}x", verdict,
                         f"{run['peak_rss_mb']:.0f}", f"{replay_mb(run):.0f}", per_request, versus])
    return rows


HEADER = ["checkout", "trace", "requests", "CPU s", "/ x1", "goal", "peak RSS MiB", "replay MiB",
          "replay B / added request", "this / baseline"]


def markdown(rows: list[list[str]], command: str) -> str:
    """The docs' page: the table without the bound's verdicts, the checkouts by name (a page names no commit)."""
    kept = [i for i, name in enumerate(HEADER) if name != "goal"]
    header = [HEADER[i] for i in kept]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row[i].split(" (")[0] if i == 0 else row[i] for i in kept) + " |" for row in rows]
    return ("# Replay cost against trace length\n\n"
            "The Azure conversation trace repeated back to back, `paged`, Qwen3-8B on an H200, vLLM v1's "
            "scheduling: the best CPU seconds of each replay, each in a fresh process, and the peak memory. The cost "
            "of a replay should grow with the requests it serves, no faster. Written by\n\n"
            f"    {command}\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    parser.add_argument("--copies", default="1,5,10", help="sizes, in copies of the trace; the first is the base")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-memory", default="16GiB")
    parser.add_argument("--baseline-path", type=Path, help="another checkout to replay the same sizes under")
    parser.add_argument("--markdown", type=Path, help="write the table here, as Markdown")
    args = parser.parse_args()
    copies = [int(c) for c in args.copies.split(",")]
    checkouts = [CHECKOUT] if args.baseline_path is None else [args.baseline_path.resolve(), CHECKOUT]
    labels = [f"{name} ({commit_of(checkout)})" for name, checkout in zip(("baseline", "this")[-len(checkouts):],
                                                                           checkouts, strict=True)]
    best = best_runs(checkouts, args.traces / TRACE, copies, args.repeats, parse_bytes(args.kv_memory))
    rows = table(best, labels, copies)
    widths = [max(len(cell) for cell in column) for column in zip(HEADER, *rows, strict=True)]
    print(f"{TRACE} repeated, paged, {args.kv_memory} KV memory; best of {args.repeats}, CPU seconds, "
          f"each replay in a fresh process, interleaved")
    for row in [HEADER, *rows]:
        print("  ".join(cell.rjust(width) if i > 1 else cell.ljust(width)
                        for i, (cell, width) in enumerate(zip(row, widths, strict=True))))
    if args.markdown is not None:
        command = (f"python benchmarks/replay_scaling.py --copies {args.copies} --repeats {args.repeats} "
                   f"--kv-memory {args.kv_memory}")
        if args.baseline_path is not None:
            command += " --baseline-path WORKTREE"
        args.markdown.write_text(markdown(rows, command))
        print(f"markdown: {args.markdown}")


if __name__ == "__main__":
    main()
