"""Start-up cost: the CPU seconds of ``minipaged simulate`` on a one-request trace, whole process, against the
interpreter's own start-up (``python -c pass``, the same run's floor), NumPy's import (which the simulator needs)
and the import of every library simulate needs (NumPy, Typer, Rich, PyYAML: what no change of ours can remove);
and of ``minipaged --version`` and ``minipaged --help``, which need none of the simulator. The two floors import
NumPy as simulate's process does, with one OpenBLAS thread (``cli/startup.py``'s ``one_blas_thread``), unless the
environment names a number of threads.

    python benchmarks/startup.py [--runs N] [--baseline-path CHECKOUT]

Each figure is the best of N fresh processes (user + system CPU of the child, ``os.wait4``): the machine is shared,
and the least a process took is the figure least disturbed by what else runs. The commands alternate, so a slow
stretch of the machine slows them alike. ``--baseline-path`` times the same commands under another checkout (before
and after a change). Every process loads compiled byte code as an installed package does: the runs share a
``PYTHONPYCACHEPREFIX`` that one untimed run per command fills first, whatever ``PYTHONDONTWRITEBYTECODE`` says.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from minipaged_cli.cli.startup import BLAS_THREAD_VARIABLES

ROOT = Path(__file__).resolve().parent.parent
ONE_REQUEST = ("version: 1\nname: one\ndescription: one request, for start-up\nrequests:\n"
               "  - {id: r0, arrival_s: 0.0, prompt_tokens: 100, output_tokens: 10}\n")
MARK_S = 0.25  # the mark for simulate on a one-request trace
# What simulate imports of other projects: the floor under its start-up that only those projects can lower.
LIBRARIES = "import numpy, typer, rich.console, rich.table, yaml"


def cpu_seconds(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """The user + system CPU seconds of one process running ``argv``; a failure ends the benchmark."""
    child = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    error = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {' '.join(argv)} failed in {cwd}: {error.decode(errors='replace').strip()}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per command; the best counts")
    parser.add_argument("--baseline-path", type=Path, help="another checkout to time the same command under")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch) / "one.yaml"
        trace.write_text(ONE_REQUEST)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(scratch) / "pycache")
        # (as simulate's process sets it before NumPy loads, where the environment names no number of threads)
        floor_env = env if any(env.get(name) for name in BLAS_THREAD_VARIABLES) else {**env,
                                                                                       "OPENBLAS_NUM_THREADS": "1"}
        cli = [sys.executable, "-m", "minipaged_cli"]
        runs = {"simulate": [*cli, "simulate", str(trace)], "--version": [*cli, "--version"],
                "--help": [*cli, "--help"]}
        # (label, argv, checkout, environment): the checkout is the working directory and PYTHONPATH, which -m
        # imports from.
        commands = [("python -c pass", [sys.executable, "-c", "pass"], ROOT, env),
                    ("python -c 'import numpy'", [sys.executable, "-c", "import numpy"], ROOT, floor_env),
                    ("the libraries' imports", [sys.executable, "-c", LIBRARIES], ROOT, floor_env)]
        for name, argv in runs.items():
            commands.append((f"{name}, this checkout", argv, ROOT, env))
            if args.baseline_path is not None:
                commands.append((f"{name}, baseline", argv, args.baseline_path.resolve(), env))
        best = {label: float("inf") for label, _, _, _ in commands}
        for run in range(args.runs + 1):
            for label, argv, checkout, environment in commands:
                seconds = cpu_seconds(argv, {**environment, "PYTHONPATH": str(checkout)}, checkout)
                if run > 0:  # the first run of each writes its byte code
                    best[label] = min(best[label], seconds)
    print(f"CPU seconds, best of {args.runs} fresh processes")
    for label, _, checkout, _ in commands:
        print(f"  {label:<28} {best[label]:7.3f}" + (f"   ({checkout})" if "," in label else ""))
    floor, numpy_s, this_s = best["python -c pass"], best["python -c 'import numpy'"], best["simulate, this checkout"]
    libraries_s = best["the libraries' imports"]
    print(f"simulate / python -c pass: {this_s / floor:.1f}x · simulate / import numpy: {this_s / numpy_s:.2f}x · "
          f"simulate above the interpreter: {this_s - floor:.3f} s · above the libraries' imports: "
          f"{this_s - libraries_s:.3f} s")
    print(f"simulate against the {MARK_S} s mark: {this_s / MARK_S:.2f}x")
    if args.baseline_path is not None:
        for name in runs:
            before, after = best[f"{name}, baseline"], best[f"{name}, this checkout"]
            print(f"{name}, baseline / this checkout: {before / after:.2f}x ({before:.3f} s -> {after:.3f} s); "
                  f"above the interpreter: {before - floor:.3f} s -> {after - floor:.3f} s")


if __name__ == "__main__":
    main()
