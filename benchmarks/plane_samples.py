"""Where a minipaged process's CPU goes, plane by plane: a sampling profiler's stacks sorted into the package's planes.

py-spy samples the process from outside it (``--nonblocking``: it never stops the process), so a function called
millions of times costs no more than it does unsampled, where cProfile charges its own cost to every call. It samples
the wall clock and leaves out the samples where the process waits (its default): a replay computes from its start to
its end, so each sample stands for the same CPU time. Each sample is a stack of frames, and it goes to the first
plane, in this order, that has a frame in one of its files:

1. start-up and output: an import (``<frozen importlib._bootstrap>``), whatever module the import runs;
2. the memory plane (``minipaged_cli/memory/``): the block manager, the pool and their compiled loops (a C loop runs
   inside the frame of the Python function that calls it);
3. scheduling, steps and accounting (``minipaged_cli/sim/``, ``minipaged_cli/fleet/``): the replay loop, the
   scheduler, the bulk advance, the step-time model, the accounting, a fleet's router;
4. trace load (``minipaged_cli/workloads/``, ``minipaged_cli/input_files.py``): reading and checking the trace.

A stack with none of them is start-up and output too: the interpreter, the command line, the tables and the JSON.
So the memory plane's work that the scheduler calls is the memory plane's, and a request's field that the scheduler
reads (``workloads/request.py``) is the scheduler's.

py-spy is an optional dependency of the benchmarks (``pip install -e ".[bench]"``); where it is missing, or cannot
read the process (it needs ptrace), ``sample_planes`` answers why in one line.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

START_UP = "start-up and output"
LOAD = "trace load"
SCHEDULING = "scheduling, steps and accounting"
MEMORY = "memory plane"
PLANES = (START_UP, LOAD, SCHEDULING, MEMORY)  # the order a page lists them in
# Each plane and the files that mark a stack as its own, in the order a stack is tested (a stack with none of them
# is START_UP's)
MARKERS = (
    (START_UP, ("<frozen importlib._bootstrap>",)),
    (MEMORY, ("minipaged_cli/memory/",)),
    (SCHEDULING, ("minipaged_cli/sim/", "minipaged_cli/fleet/")),
    (LOAD, ("minipaged_cli/workloads/", "minipaged_cli/input_files.py")),
)
SAMPLES_PER_S = 1000


def frame_file(frame: str) -> str:
    """The file of one frame of py-spy's raw output, ``function (file:line)``."""
    return frame[frame.rfind(" (") + 2:].rpartition(":")[0]


def plane_of(frames: Sequence[str]) -> str:
    """The plane a sampled stack's time goes to (the module docstring's rules)."""
    files = [frame_file(frame) for frame in frames]
    for plane, markers in MARKERS:
        if any(marker in file for file in files for marker in markers):
            return plane
    return START_UP


def count_planes(raw: str) -> dict[str, int]:
    """Samples per plane in py-spy's raw output: a stack a line, its frames outermost first and separated by ``;``,
    then a space and its count of samples."""
    counts = dict.fromkeys(PLANES, 0)
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            counts[plane_of(stack.split(";") if stack else [])] += int(count)
    return counts


def sample_planes(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, int] | str:
    """Run ``argv`` (a Python process) to its end under py-spy, asking for ``SAMPLES_PER_S`` samples a second (it
    takes fewer where it falls behind; the shares stay fair): its samples per plane; or, where py-spy is missing or
    fails, one line saying why."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return "Plane split skipped: py-spy is not installed (pip install py-spy)."
    with tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch) / "samples.txt"
        done = subprocess.run([py_spy, "record", "--nonblocking", "--rate", str(SAMPLES_PER_S), "--format", "raw",
                               "--output", str(raw), "--", *argv], env=env, cwd=cwd, capture_output=True, text=True)
        if done.returncode or not raw.exists():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return f"Plane split skipped: py-spy could not sample the process ({last})."
        return count_planes(raw.read_text(errors="replace"))
