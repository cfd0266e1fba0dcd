"""minipaged against NVIDIA Dynamo's Rust simulator core, side by side: the same traces, pools and settings, each
simulator run as a whole process (start-up included).

The Rust core (the engine behind AISimulate and Dynamo's mocker) ships in ``ai-dynamo-runtime`` and is driven
through ``ai-dynamo``'s ``dynamo.replay.run_trace_replay``; it is an optional dependency of this benchmark only.
Install it into an environment of its own and name that environment's Python with ``--dynamo-python``:

    python -m venv /tmp/dynvenv
    /tmp/dynvenv/bin/pip install ai-dynamo-runtime==1.6.1
    /tmp/dynvenv/bin/pip install --no-deps ai-dynamo==1.6.1

Where ``dynamo.replay`` does not import, the Dynamo column is skipped with one line saying why.

``--minipaged-python`` names the Python that runs minipaged (default: this one). Give it an environment of its own
too, with minipaged's dependencies alone (``pip install -e .`` in a fresh virtual environment), so that the two
start alike: a Python starts by running every ``.pth`` file in its site-packages, and a shared environment's may
import what neither simulator uses.

Rows (``--rows``): the Mooncake conversation trace (12,031 requests) at 3,640 and at 58,240 blocks; the Azure
conversation trace at ten times its rate (converted to Mooncake JSONL, the one format both read, with a hash id of
its own for every 512 tokens of a prompt: nothing shared); and a 16-replica fleet of 3,640 blocks each on the
Mooncake trace at sixteen times its rate (each replica about as loaded as the single one), routed round-robin and
KV-aware (minipaged's ``--router prefix-aware``, Dynamo's ``router_mode="kv_router"``). Every row: 16-token blocks,
an 8,192-token budget a step, at most 1,024 sequences, prefix caching on, recompute preemption of the latest
admitted request, and requests (prompt + output) up to 131,072 tokens (``max_model_len``: the Mooncake trace's
longest fit) or the pool's size in tokens where that is smaller: a longer request can never finish, and given one the
Rust core stops ("replay invariant violated: ... effect-free zero-duration pass").

minipaged's processes load compiled byte code, as the core's do (``pip install`` compiles an installed package's;
this checkout's is compiled once, before the first row, into its ``__pycache__`` folders, whatever
``PYTHONDONTWRITEBYTECODE`` says): a fresh compile of the package is no part of a replay.

Each row runs ``--repeats`` pairs, the two commands alternating (which goes first alternates too), and reports the
median CPU seconds (user + system, the child process's own ``os.wait4`` accounting) and peak resident memory of
each side, the prefix hit % and preemptions of the last pair, and the median of the pairs' ratios minipaged / core.
Dynamo's hit % is its ``first_admission_prefix_cache_reused_ratio`` (prompt tokens found cached when a request is
first admitted, over all prompt tokens: minipaged's ``prefix_cache_hits / prefix_cache_queries``), its preemptions
the sum over its replay telemetry's intervals.

``--planes`` runs minipaged once more per row under py-spy (``pip install -e ".[bench]"``) and splits its CPU into
the package's planes (``plane_samples.py``): start-up and output, trace load, scheduling, steps and accounting, and
the memory plane, each as seconds of the row's median beside the core's whole run. ``--profile N`` runs it once more
under cProfile and lists the N functions and the N files of the package (or libraries) with the most self time.
(cProfile's own cost falls on every call, so it inflates the share of functions called millions of times; the order
is what it shows. The planes' samples cost the process nothing.)

    python benchmarks/peer_speed.py [--traces DIR] [--rows NAME,...] [--repeats N] [--dynamo-python PYTHON]
        [--minipaged-python PYTHON] [--planes] [--profile N] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from plane_samples import PLANES, SAMPLES_PER_S, sample_planes

CHECKOUT = Path(__file__).resolve().parents[1]
MOONCAKE = "mooncake_conversation_trace.jsonl"
AZURE = "AzureLLMInferenceTrace_conv.csv"
INSTALL = "pip install ai-dynamo-runtime==1.6.1 && pip install --no-deps ai-dynamo==1.6.1"

# The settings both simulators get, on every row.
BLOCK_SIZE = 16
MAX_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 1024
MAX_MODEL_LEN = 131072  # or the pool's tokens, where fewer (Row.max_model_len)
TRACE_BLOCK_SIZE = 512  # tokens a Mooncake hash id stands for (the trace's own)

# What the two cannot share: the page says so under its table.
UNMATCHED = [
    "Step times: the Rust core's built-in polynomial step-time model against minipaged's model of Qwen3-8B on an "
    "H200; simulated time, and so the step count, arrivals per step and the batches, differ.",
    "KV-aware routing: Dynamo's KV router (its default `KvRouterConfig`, router temperature 0) against "
    "minipaged's `prefix-aware` router (its default precise prefix index); the two score replicas differently, "
    "so they route differently. Dynamo's KV router picks at random among replicas of equal cost (its "
    "`run_synthetic_trace_replay` docstring says so), so its hit % and preemptions on that row vary from run to "
    "run; minipaged's do not.",
]


@dataclass(frozen=True)
class Row:
    """One line of the table: a trace, a pool per replica, a rate and a fleet."""

    name: str
    label: str
    trace: str  # a file under --traces
    num_blocks: int  # per replica
    rate: float = 1.0  # times the trace's request rate
    replicas: int = 1
    router: str | None = None  # minipaged's router (None: one replica)

    @property
    def max_model_len(self) -> int:
        """The longest request served: what the pool of one replica can hold, at most ``MAX_MODEL_LEN``."""
        return min(MAX_MODEL_LEN, self.num_blocks * BLOCK_SIZE)


ROWS = [
    Row("mooncake-58240", "Mooncake conversation, 58,240 blocks", MOONCAKE, 58240),
    Row("mooncake-3640", "Mooncake conversation, 3,640 blocks", MOONCAKE, 3640),
    Row("azure-x10", "Azure conversation x10 rate, 3,640 blocks", AZURE, 3640, rate=10.0),
    Row("fleet-round-robin", "Mooncake x16 rate, 16 replicas x 3,640 blocks, round-robin", MOONCAKE, 3640,
        rate=16.0, replicas=16, router="round-robin"),
    Row("fleet-kv-aware", "Mooncake x16 rate, 16 replicas x 3,640 blocks, KV-aware", MOONCAKE, 3640, rate=16.0,
        replicas=16, router="prefix-aware"),
]
DYNAMO_ROUTERS = {"round-robin": "round_robin", "prefix-aware": "kv_router"}


@dataclass(frozen=True)
class Run:
    """One simulator process: its CPU seconds and peak memory, and the figures it reported."""

    cpu_s: float
    peak_rss_mb: float
    hit_pct: float
    preemptions: int
    completed: int


def timed_process(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``argv`` to its end: (CPU seconds, user + system, of the process and the children it waited for; its
    peak resident memory, MiB). Raises, with its stderr, where it fails."""
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=CHECKOUT)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if process.returncode:
        raise RuntimeError(f"{shlex.join(argv)} exited {process.returncode}:\n{stderr}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # Linux: ru_maxrss in KiB


def minipaged_argv(row: Row, trace: Path, json_path: Path, python: str = sys.executable) -> list[str]:
    """``minipaged simulate`` on ``row`` run by ``python``, its results as JSON in ``json_path``."""
    argv = [python, "-m", "minipaged_cli", "simulate", str(trace), "--strategies", "paged",
            "--block-size", str(BLOCK_SIZE), "--num-blocks", str(row.num_blocks), "--max-batched-tokens",
            str(MAX_BATCHED_TOKENS), "--max-num-seqs", str(MAX_NUM_SEQS), "--max-model-len", str(row.max_model_len),
            "--prefix-caching", "--preemption", "recompute", "--json", str(json_path)]
    if row.rate != 1.0:
        argv += ["--time-scale", repr(1 / row.rate)]
    if row.replicas > 1:
        argv += ["--replicas", str(row.replicas), "--router", str(row.router)]
    return argv


def compiled_env(checkout: Path = CHECKOUT, python: str = sys.executable) -> dict[str, str]:
    """The environment minipaged's processes run in: ``checkout`` on the path, its modules' byte code compiled
    where an import finds it (``python -m compileall``, run here: it writes the files whatever
    ``PYTHONDONTWRITEBYTECODE`` says; an installed package's come so from ``pip install``). Where the checkout
    cannot be written, the runs compile what they import, as they would without this."""
    compiled = subprocess.run([python, "-m", "compileall", "-q", str(checkout / "minipaged_cli")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if compiled.returncode:
        print(f"note: {checkout / 'minipaged_cli'}'s byte code could not be written; each run compiles what it "
              "imports", file=sys.stderr)
    return {**os.environ, "PYTHONPATH": str(checkout)}


def run_minipaged(row: Row, trace: Path, env: dict[str, str], python: str = sys.executable) -> Run:
    with tempfile.TemporaryDirectory() as scratch:
        json_path = Path(scratch) / "result.json"
        cpu_s, peak_mb = timed_process(minipaged_argv(row, trace, json_path, python), env)
        result = json.loads(json_path.read_text())
    figures = result["fleet"] if row.replicas > 1 else result["strategies"]["paged"]
    return Run(cpu_s, peak_mb, figures["prefix_cache_hit_pct"], figures["num_preemptions"],
               figures["completed_requests"])


@dataclass(frozen=True)
class Profile:
    """Where one minipaged run of a row spent its time: the functions and the files with the most self time, each
    with its share of the run's profiled time (%)."""

    row: Row
    functions: list[tuple[str, float]]
    files: list[tuple[str, float]]


def profile_minipaged(row: Row, trace: Path, top: int, env: dict[str, str], python: str = sys.executable) -> Profile:
    """One more minipaged run of ``row``, under cProfile: its ``top`` functions and files by self time."""
    with tempfile.TemporaryDirectory() as scratch:
        stats_path = Path(scratch) / "run.prof"
        argv = minipaged_argv(row, trace, Path(scratch) / "result.json", python)
        argv[1:1] = ["-m", "cProfile", "-o", str(stats_path)]
        timed_process(argv, env)
        # {(file, line, function): (primitive calls, calls, self seconds, cumulative seconds, callers)}
        stats = pstats.Stats(str(stats_path)).stats  # type: ignore[attr-defined]
    functions: dict[str, float] = {}
    files: dict[str, float] = {}
    for (filename, _, name), (_, _, self_s, _, _) in stats.items():
        where = short_path(filename)
        functions[f"{where}: {name}"] = functions.get(f"{where}: {name}", 0.0) + self_s
        files[where] = files.get(where, 0.0) + self_s
    total = sum(files.values()) or 1.0
    return Profile(row, top_shares(functions, total, top), top_shares(files, total, top))


def top_shares(seconds: dict[str, float], total: float, top: int) -> list[tuple[str, float]]:
    """The ``top`` names with the most seconds, each with its % of ``total``, most first."""
    ranked = sorted(seconds.items(), key=lambda item: -item[1])[:top]
    return [(name, 100 * spent / total) for name, spent in ranked]


def short_path(filename: str) -> str:
    """A profiled file as the page names it: ``memory/block_pool.py`` in the package, ``numpy/...`` in a library,
    ``built-in`` for the interpreter's built-ins (cProfile's ``~``)."""
    if filename == "~":
        return "built-in"
    path = Path(filename)
    package = CHECKOUT / "minipaged_cli"
    if path.is_relative_to(package):
        return path.relative_to(package).as_posix()
    parts = path.parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    return path.name if path.suffix == ".py" else filename


def dynamo_settings(row: Row) -> dict[str, Any]:
    """The keyword arguments of ``dynamo.replay.run_trace_replay`` for ``row`` (the same settings as
    ``minipaged_argv``'s)."""
    engine = {"block_size": BLOCK_SIZE, "num_gpu_blocks": row.num_blocks, "max_num_seqs": MAX_NUM_SEQS,
              "max_num_batched_tokens": MAX_BATCHED_TOKENS, "max_model_len": row.max_model_len,
              "enable_prefix_caching": True, "enable_chunked_prefill": True, "preemption_mode": "lifo"}
    settings: dict[str, Any] = {"engine": engine, "trace_block_size": TRACE_BLOCK_SIZE,
                                "arrival_speedup_ratio": row.rate, "num_workers": row.replicas}
    if row.router is not None:
        settings["router_mode"] = DYNAMO_ROUTERS[row.router]
    return settings


def dynamo_side(trace: str, settings_json: str, result_path: str) -> None:
    """Run in the Dynamo environment's Python (``--dynamo-side``): one replay, its figures as JSON."""
    import dynamo.replay
    from dynamo._core import _normalize_mocker_config  # what dynamo.mocker.config wraps, without its extra deps

    settings = json.loads(settings_json)
    engine_args = _normalize_mocker_config({"engine": settings.pop("engine")})
    samples: list[dict[str, Any]] = []
    # One sampling interval longer than any replay: a baseline and a final sample, whose intervals sum the whole.
    telemetry = dynamo.replay.TelemetryOptions(sample_interval_ms=1e15, callback=samples.append)
    report = dynamo.replay.run_trace_replay(trace, extra_engine_args=engine_args, telemetry_options=telemetry,
                                            **settings)
    preemptions = sum(sample[side]["preemptions"] for sample in samples
                      for side in ("prefill_interval_metrics", "decode_interval_metrics"))
    summary = report.summary
    Path(result_path).write_text(json.dumps({
        "hit_pct": 100 * summary["first_admission_prefix_cache_reused_ratio"], "preemptions": preemptions,
        "completed": summary["completed_requests"]}))


def run_dynamo(python: str, row: Row, trace: Path) -> Run:
    with tempfile.TemporaryDirectory() as scratch:
        result_path = Path(scratch) / "result.json"
        argv = [python, str(Path(__file__).resolve()), "--dynamo-side", str(trace),
                json.dumps(dynamo_settings(row)), str(result_path)]
        cpu_s, peak_mb = timed_process(argv, {**os.environ, "DYN_LOG": "error"})
        result = json.loads(result_path.read_text())
    return Run(cpu_s, peak_mb, result["hit_pct"], result["preemptions"], result["completed"])


def dynamo_missing(python: str) -> str | None:
    """Why ``python`` cannot run the Dynamo column (None: it can)."""
    done = subprocess.run([python, "-c", "import dynamo.replay, dynamo._core"], capture_output=True, text=True)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["it failed"])[-1]
    return (f"Dynamo column skipped: {python} cannot import dynamo.replay ({last}); install it with "
            f"`{INSTALL}` and pass that environment's Python as --dynamo-python.")


def mooncake_jsonl(azure_csv: Path, out: Path) -> Path:
    """``azure_csv`` as Mooncake JSONL (arrivals in whole ms from the first; a fresh hash id per 512 prompt tokens,
    so no prefix is shared): the one format both simulators read."""
    from minipaged_cli.workloads.readers import load_trace

    requests = load_trace(azure_csv).requests
    start = requests[0].arrival_s
    next_hash = 0
    with out.open("w") as lines:
        for request in requests:
            num_hashes = -(-request.prompt_tokens // TRACE_BLOCK_SIZE)
            lines.write(json.dumps({"timestamp": round(1000 * (request.arrival_s - start)),
                                    "input_length": request.prompt_tokens, "output_length": request.output_tokens,
                                    "hash_ids": list(range(next_hash, next_hash + num_hashes))}) + "\n")
            next_hash += num_hashes
    return out


@dataclass(frozen=True)
class Measured:
    """A row's pairs: minipaged's runs and the core's (empty where it was skipped), in order."""

    row: Row
    minipaged: list[Run]
    core: list[Run]
    planes: dict[str, int] | None = None  # one more minipaged run's py-spy samples per plane (``--planes``)


def measure_row(row: Row, trace: Path, repeats: int, dynamo_python: str | None, env: dict[str, str],
                minipaged_python: str = sys.executable) -> Measured:
    minipaged: list[Run] = []
    core: list[Run] = []
    for repeat in range(repeats):
        # Alternate which goes first, so that neither always runs in the other's wake.
        sides = ["minipaged", "core"] if repeat % 2 == 0 else ["core", "minipaged"]
        for side in sides:
            if side == "minipaged":
                minipaged.append(run_minipaged(row, trace, env, minipaged_python))
            elif dynamo_python is not None:
                core.append(run_dynamo(dynamo_python, row, trace))
        print(f"  {row.name} pair {repeat + 1}/{repeats}: minipaged {minipaged[-1].cpu_s:.2f} s"
              + (f", core {core[-1].cpu_s:.2f} s" if core else ""), file=sys.stderr, flush=True)
    return Measured(row, minipaged, core)


HEADER = ["row", "core CPU s", "minipaged CPU s", "core peak MiB", "minipaged peak MiB", "hit % (core / minipaged)",
          "preemptions (core / minipaged)", "completed (core / minipaged)", "minipaged / core",
          "middle half of the pairs' ratios"]


def table_row(measured: Measured) -> list[str]:
    """Medians of CPU seconds and peak memory, the last pair's figures, and the median of the pairs' ratios with
    their first and third quartiles."""
    mine, core = measured.minipaged, measured.core
    last = mine[-1]
    if not core:
        return [measured.row.label, "-", f"{statistics.median(r.cpu_s for r in mine):.2f}", "-",
                f"{statistics.median(r.peak_rss_mb for r in mine):.0f}", f"- / {last.hit_pct:.2f}",
                f"- / {last.preemptions}", f"- / {last.completed:,}", "-", "-"]
    ratios = [m.cpu_s / c.cpu_s for m, c in zip(mine, core, strict=True)]
    ratio = statistics.median(ratios)
    verdict = "slower" if ratio > 1 else "faster" if ratio < 1 else "even"
    # (the spread the machine's noise gives a row: the first to the third quartile of its pairs' ratios)
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratio] * 3
    return [measured.row.label, f"{statistics.median(r.cpu_s for r in core):.2f}",
            f"{statistics.median(r.cpu_s for r in mine):.2f}", f"{statistics.median(r.peak_rss_mb for r in core):.0f}",
            f"{statistics.median(r.peak_rss_mb for r in mine):.0f}", f"{core[-1].hit_pct:.2f} / {last.hit_pct:.2f}",
            f"{core[-1].preemptions} / {last.preemptions}", f"{core[-1].completed:,} / {last.completed:,}",
            f"{ratio:.2f}x ({verdict})", f"{quartiles[0]:.2f}-{quartiles[2]:.2f}"]


PLANES_HEADER = ["row", "core CPU s", "minipaged CPU s", *PLANES]


def planes_row(measured: Measured) -> list[str]:
    """A row's plane split: each plane's share of the samples, as seconds of minipaged's median CPU seconds and as
    %, beside the core's median (``-`` where it was skipped)."""
    assert measured.planes is not None
    cpu_s = statistics.median(r.cpu_s for r in measured.minipaged)
    total = sum(measured.planes.values()) or 1
    core = f"{statistics.median(r.cpu_s for r in measured.core):.2f}" if measured.core else "-"
    return [measured.row.label, core, f"{cpu_s:.2f}",
            *(f"{cpu_s * measured.planes[plane] / total:.2f} ({100 * measured.planes[plane] / total:.0f}%)"
              for plane in PLANES)]


def planes_section(split: list[list[str]], skipped: str | None) -> str:
    """The page's plane split: what the samples are, the rule that sorts them, and the table (or why it is missing)."""
    text = ("\n## Where minipaged's CPU goes, by plane\n\n"
            f"One more run of each row, sampled by py-spy from outside the process, up to {SAMPLES_PER_S:,} times a "
            "second (so the calls it samples cost nothing more). A sample goes to the first of these with a frame on "
            "its stack: an import (start-up); the memory plane (`minipaged_cli/memory/`: the block manager, the pool "
            "and their compiled loops); scheduling, steps and accounting (`sim/`, `fleet/`: the replay loop, the "
            "scheduler, the bulk advance, the step-time model, the accounting, a fleet's router); the trace's reading "
            "(`workloads/`, `input_files.py`). The rest (the interpreter, the command line, the tables and the JSON) "
            "is start-up and output. Each plane's seconds are its share of the samples times minipaged's median CPU "
            "seconds above (`benchmarks/plane_samples.py`).\n\n")
    if skipped is not None:
        return text + skipped + "\n"
    return text + "\n".join(markdown_table(PLANES_HEADER, split)) + "\n"


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines: the header, its rule, a line a row."""
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def profile_lines(profile: Profile) -> list[str]:
    """A row's profile on the page: its functions and its files by self time."""
    lines = [f"### {profile.row.label}", "", "| function (self time) | % | file (self time) | % |", "|---|---|---|---|"]
    for (function, function_pct), (file, file_pct) in zip(profile.functions, profile.files, strict=False):
        lines.append(f"| `{function}` | {function_pct:.1f} | `{file}` | {file_pct:.1f} |")
    return [*lines, ""]


def markdown(rows: list[list[str]], command: str, repeats: int, skipped: str | None,
             profiles: list[Profile] | None = None, planes: str | None = None) -> str:
    """The docs page: what ran, the command that reproduces it, the table, what could not be matched, and where
    minipaged's time goes (``planes``: ``planes_section``'s text; ``profiles``)."""
    lines = markdown_table(HEADER, rows)
    settings = (f"{BLOCK_SIZE}-token blocks, an {MAX_BATCHED_TOKENS:,}-token budget a step, at most "
                f"{MAX_NUM_SEQS:,} sequences, prefix caching on, recompute preemption of the latest admitted "
                f"request, requests (prompt + output) up to {MAX_MODEL_LEN:,} tokens or the pool's size in tokens "
                "where that is smaller (a longer request can never finish, and given one the Rust core stops with "
                "\"replay invariant violated\")")
    text = ("# minipaged against Dynamo's Rust simulator core\n\n"
            "NVIDIA Dynamo's simulator core (`ai-dynamo-runtime` 1.6.1, driven through `ai-dynamo` 1.6.1's "
            "`dynamo.replay`) and `minipaged simulate` on the same traces and pools, with the same settings: "
            f"{settings}. Each simulator runs as a whole process, start-up included, loading compiled byte code "
            "(the core's compiled by `pip install`, minipaged's once before the first run); CPU seconds are user + "
            f"system time, medians of {repeats} paired runs (the two commands alternating), and the ratio is the "
            "median of the pairs' ratios minipaged / core, beside the first and third quartiles of those ratios (how "
            "far the machine's noise moved them). Hit % and preemptions are the last pair's. "
            "The core's hit % is its `first_admission_prefix_cache_reused_ratio` (prompt tokens found cached at a "
            "request's first admission, over all prompt tokens, as minipaged counts them), its preemptions the sum "
            "over its replay telemetry. The Azure trace is converted to Mooncake JSONL, the one format both read, "
            "with a hash id of its own for every 512 prompt tokens (nothing shared). The fleet rows replay the "
            "Mooncake trace at sixteen times its rate over 16 replicas of 3,640 blocks each. Written by\n\n"
            f"    {command}\n\n"
            "with the Dynamo packages installed as `benchmarks/peer_speed.py`'s docstring says"
            + (" and minipaged's dependencies alone in an environment of their own" if "--minipaged-python" in command
               else "") + ".\n\n")
    if skipped is not None:
        text += skipped + "\n\n"
    text += "\n".join(lines) + "\n\nWhat the two cannot share:\n\n" + "".join(f"- {line}\n" for line in UNMATCHED)
    if planes is not None:
        text += planes
    if profiles:
        text += ("\n## Where minipaged's time goes\n\n"
                 "One more run of each row under cProfile: the functions and the files (of the package, else the "
                 "library or the interpreter's built-ins) with the most self time, as % of the run's profiled time. "
                 "cProfile's own cost falls on every call, so functions called millions of times (the block pool's "
                 "per-block work) read higher than they run without it.\n\n")
        text += "\n".join(line for profile in profiles for line in profile_lines(profile))
    return text


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """A table on stdout: the first column left-aligned, the others right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(row, widths, strict=True))))


def main() -> None:
    if sys.argv[1:2] == ["--dynamo-side"]:
        dynamo_side(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=CHECKOUT.parent / "shared" / "traces")
    parser.add_argument("--rows", default=",".join(row.name for row in ROWS), help="comma-separated row names")
    parser.add_argument("--repeats", type=int, default=3, help="paired runs per row")
    parser.add_argument("--dynamo-python", default=sys.executable,
                        help="a Python that imports dynamo.replay (default: this one)")
    parser.add_argument("--minipaged-python", default=sys.executable,
                        help="the Python that runs minipaged, with its dependencies installed (default: this one)")
    parser.add_argument("--planes", action="store_true",
                        help="sample one more minipaged run per row with py-spy: its CPU split into the planes")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile one more minipaged run per row: its N functions and files with most self time")
    parser.add_argument("--markdown", type=Path, help="write the table here, as the docs page")
    args = parser.parse_args()
    by_name = {row.name: row for row in ROWS}
    unknown = [name for name in args.rows.split(",") if name not in by_name]
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)} (choose from {', '.join(by_name)})")
    chosen = [by_name[name] for name in args.rows.split(",")]
    skipped = dynamo_missing(args.dynamo_python)
    if skipped is not None:
        print(skipped)
    profiles: list[Profile] = []
    planes_skipped: str | None = None
    with tempfile.TemporaryDirectory() as scratch:
        env = compiled_env(python=args.minipaged_python)
        measured = []
        for row in chosen:
            trace = args.traces / row.trace
            if row.trace == AZURE:
                trace = mooncake_jsonl(trace, Path(scratch) / "azure_conv.jsonl")
            measured.append(measure_row(row, trace, args.repeats, None if skipped else args.dynamo_python, env,
                                        args.minipaged_python))
            if args.planes and planes_skipped is None:
                argv = minipaged_argv(row, trace, Path(scratch) / "planes.json", args.minipaged_python)
                sampled = sample_planes(argv, env, CHECKOUT)
                if isinstance(sampled, str):
                    planes_skipped = sampled
                    print(sampled)
                else:
                    measured[-1] = replace(measured[-1], planes=sampled)
            if args.profile > 0:
                profiles.append(profile_minipaged(row, trace, args.profile, env, args.minipaged_python))
    rows = [table_row(m) for m in measured]
    print_table(HEADER, rows)
    split = [planes_row(m) for m in measured if m.planes is not None]
    if split:
        print()
        print_table(PLANES_HEADER, split)
    for profile in profiles:
        print(f"\nminipaged's self time, % of a profiled run of {profile.row.label}")
        for name, pct in [*profile.functions, *profile.files]:
            print(f"  {pct:5.1f}  {name}")
    if args.markdown is not None:
        command = f"python benchmarks/peer_speed.py --repeats {args.repeats} --dynamo-python PYTHON"
        if args.minipaged_python != sys.executable:
            command += " --minipaged-python MINIPAGED_PYTHON"
        if args.rows != parser.get_default("rows"):
            command += f" --rows {args.rows}"
        if args.planes:
            command += " --planes"
        if args.profile > 0:
            command += f" --profile {args.profile}"
        command += f" --markdown {args.markdown}"
        planes = planes_section(split, planes_skipped) if args.planes else None
        args.markdown.write_text(markdown(rows, command, args.repeats, skipped, profiles, planes))
        print(f"markdown: {args.markdown}")


if __name__ == "__main__":
    main()
