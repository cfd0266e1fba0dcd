"""The command line's start-up: the cyclic garbage collector is paused while its modules import, and while a
command reads its trace, and the command line's own process freezes what they allocated (``lasting``).

Importing Typer, Rich, NumPy and a command's modules allocates tens of thousands of objects that live as long as
the process. Each time the allocations pass the collector's threshold it traverses the young objects again, and
finds nothing to free (about 60 collections in simulate's start-up); and at the process's exit it traverses all
of them once more. Paused, it traverses them once, when it resumes. The process that runs the command line (the
console script, ``python -m minipaged_cli``; not a program that imports it) freezes them instead (``gc.freeze``):
no collection traverses them again, the exit's included. Together about 30 ms of the 0.29 s that simulate took on
a one-request trace; the price, a cycle an import leaves (a few hundred objects) is never collected. A trace is
the same: its requests live until the replay's report, and reading the Azure conversation trace's 19,366 made about
140 of the 180 collections of simulate's run on it, each finding nothing to free.

A replay runs with the collector paused too (``collector_paused``): the replay of one engine makes no reference
cycles (``gc.collect()`` after the Azure conversation trace's replay finds none), so the 40-odd collections its
allocations passed the threshold for traversed its young objects for nothing.

A replay command's process also asks NumPy's OpenBLAS for one thread before NumPy loads (``one_blas_thread``).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def is_command_line() -> bool:
    """Whether this process runs the command line: the console script ``minipaged`` or ``python -m minipaged_cli``
    (whose ``__main__`` is the package's), not a program that imports it."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "minipaged_cli.__main__" or Path(sys.argv[0]).name == "minipaged"


# The commands whose NumPy work is a replay's: dot products a few elements long, which BLAS threads never speed up
REPLAY_COMMANDS = frozenset({"simulate", "sweep", "convert"})
# What OpenBLAS reads for its number of threads, first found first: a user who set one has chosen
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def one_blas_thread(command: str) -> None:
    """In the command line's own process, before ``command`` imports NumPy: where it is a replay command and the
    user chose no number of threads, NumPy's OpenBLAS gets one (``OPENBLAS_NUM_THREADS=1``, which the processes it
    starts inherit: a sweep's workers). At import OpenBLAS starts a thread per core, and they spin while they wait
    for work a replay never gives them: on two cores, 0.06 s of CPU at import and a third of simulate's start-up;
    more on more cores. The commands that run torch keep the default (torch may use OpenBLAS for its own work)."""
    if command in REPLAY_COMMANDS and is_command_line() and not any(os.environ.get(name)
                                                                     for name in BLAS_THREAD_VARIABLES):
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


@contextmanager
def lasting() -> Iterator[None]:
    """Run the block (imports, a trace's reading: what it allocates lasts as long as the process) with the cyclic
    collector paused (``collector_paused``); in the command line's own process, what the process holds is frozen
    before it resumes."""
    with collector_paused():
        try:
            yield
        finally:
            if is_command_line():
                gc.freeze()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block (a replay) with the cyclic collector off, then leave it as it was (off stays off: a caller's
    choice). What the block frees is freed by reference counts all the same; the few cycles it may leave (a
    fleet's replay: some thousands of objects) wait for the collector's next pass after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
