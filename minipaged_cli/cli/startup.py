"""The command line's start-up: the cyclic garbage collector is paused while its modules import, and the command
line's own process freezes what they allocated.

Importing Typer, Rich, NumPy and a command's modules allocates tens of thousands of objects that live as long as
the process. Each time the allocations pass the collector's threshold it traverses the young objects again, and
finds nothing to free (about 60 collections in simulate's start-up); and at the process's exit it traverses all
of them once more. Paused, it traverses them once, when it resumes. The process that runs the command line (the
console script, ``python -m minipaged_cli``; not a program that imports it) freezes them instead (``gc.freeze``):
no collection traverses them again, the exit's included. Together about 30 ms of the 0.29 s that simulate took on
a one-request trace; the price, a cycle an import leaves (a few hundred objects) is never collected.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def is_command_line() -> bool:
    """Whether this process runs the command line: the console script ``minipaged`` or ``python -m minipaged_cli``
    (whose ``__main__`` is the package's), not a program that imports it."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "minipaged_cli.__main__" or Path(sys.argv[0]).name == "minipaged"


@contextmanager
def importing() -> Iterator[None]:
    """Run the block (imports) with the cyclic collector off, then leave it as it was (off stays off: a caller's
    choice); in the command line's own process, what the process holds is frozen first."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if is_command_line():
            gc.freeze()
        if was_enabled:
            gc.enable()
