"""Output files of every command (``--json``, ``--csv``, ``--plot``, ``OUT``): checked before the work starts, so a
sweep of hours cannot end on an unwritable path, and written atomically, so a failure leaves nothing half-written.

A command calls ``check_outputs`` with every path it was given, before loading or replaying anything, then writes
each file through ``atomic_output`` (or ``write_text``). '-' names stdout and ``None`` an output not asked for:
both are skipped.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from minipaged_cli.errors import InputError

STDOUT = "-"


def check_outputs(outputs: dict[str, str | Path | None]) -> None:
    """Raise ``InputError`` unless every output (option name -> path) can be written: its directory exists and
    takes a new file, the path is not a directory, and no two options name the same file."""
    seen: dict[Path, str] = {}
    for field, path in outputs.items():
        if path is None or str(path) == STDOUT:
            continue
        target = _resolved(path)
        if target in seen:
            raise InputError(f"{seen[target]} names the same file", field=field, value=str(path), has_value=True)
        seen[target] = field
        if target.is_dir():
            raise InputError("is a directory; name a file in it", field=field, value=str(path), has_value=True)
        directory = target.parent
        if not directory.is_dir():
            reason = "no such directory" if not directory.exists() else "not a directory"
            raise InputError(f"{reason}: {directory}", field=field, value=str(path), has_value=True)
        if _special(target):
            if not os.access(target, os.W_OK):
                raise InputError("cannot write: permission denied", field=field, value=str(path), has_value=True)
            continue
        # Creating a file is the only test that tells the truth for root, ACLs and read-only mounts alike.
        try:
            handle, probe = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
        except OSError as error:
            raise InputError(f"cannot write in {directory}: {error.strerror}", field=field, value=str(path),
                             has_value=True) from None
        os.close(handle)
        os.unlink(probe)


@contextmanager
def atomic_output(path: str | Path, field: str) -> Iterator[Path]:
    """A temporary path beside ``path`` (same directory, same suffix, so writers that go by the suffix still
    work) to write the whole output to; renamed onto ``path`` when the block ends, removed if it raises.

    A device or pipe (``/dev/null``, ``/dev/stdout``) is written in place: renaming onto it would replace the
    device node. ``OSError`` becomes ``InputError`` naming ``field`` and the path.
    """
    target = _resolved(path)
    if _special(target):
        with _as_input_error(field, path):
            yield target
        return
    with _as_input_error(field, path):
        handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        with _as_input_error(field, path):
            yield temporary
            os.chmod(temporary, _mode(target))
            os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def write_text(path: str | Path, text: str, field: str) -> None:
    """``text`` (UTF-8) to ``path``, atomically."""
    with atomic_output(path, field) as temporary:
        temporary.write_text(text, encoding="utf-8")


def _resolved(path: str | Path) -> Path:
    """The file a write lands in: through symbolic links (a rename would replace the link itself)."""
    return Path(os.path.realpath(Path(path).expanduser()))


def _special(path: Path) -> bool:
    """An existing path that is not a regular file: a device, a pipe."""
    return path.exists() and not path.is_file()


def _mode(target: Path) -> int:
    """The mode the file would have had if written in place: the existing file's, else 0o666 less the umask
    (``mkstemp`` creates 0o600)."""
    if target.exists():
        return stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def _as_input_error(field: str, path: str | Path) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        raise InputError(f"cannot write: {error.strerror or error}", field=field, value=str(path),
                         has_value=True) from None
