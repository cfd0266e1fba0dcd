"""Native code built at run time and cached in ~/.cache/minipaged: the cache's place (``cache_dir``), a compile
into it (``compile_into``), CPython extensions of one C file (``build_extension``: the block pool's loops, the
prefix keys), each built once a process (``built``), and which runs, the compiled code or its Python reference
(``chosen``, after ``MINIPAGED_NATIVE``). The data plane's host C++ libraries are built by ``dataplane/build.py``
with the first two."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")


def cache_dir() -> Path:
    """~/.cache/minipaged (or $XDG_CACHE_HOME), or the temporary directory where home is not writable."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "minipaged"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        base = Path(tempfile.gettempdir()) / f"minipaged-{os.getuid()}"
        base.mkdir(parents=True, exist_ok=True)
    return base


def build_extension(name: str, source: Path) -> ModuleType:
    """Compile ``source`` (C defining ``PyInit_<name>``) into an extension module for this interpreter, unless one
    built from the same source and the same headers of its own (its ``#include "..."`` lines, beside it) for the same
    Python is cached, and import it. RuntimeError when there is no C
    compiler or no ``Python.h`` (a Python installed without its headers), when the build fails or takes over two
    minutes, when no cache directory can be written, or when the built module does not load."""
    include = sysconfig.get_paths()["include"]
    flags = ["-O2", "-shared", "-fPIC", f"-I{include}"]
    if sys.platform == "darwin":  # (the interpreter's symbols resolve when it loads the module)
        flags += ["-undefined", "dynamic_lookup"]
    digest = hashlib.sha256(" ".join([sys.version, *flags]).encode())
    text = source.read_bytes()
    digest.update(text)
    for header in re.findall(rb'^#include "([^"]+)"', text, flags=re.MULTILINE):  # (its own headers: a change rebuilds)
        try:
            digest.update(Path(source.parent, header.decode()).read_bytes())
        except OSError as error:
            raise RuntimeError(f"{name}: its header {header.decode()} cannot be read ({error})") from error
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    try:
        target = cache_dir() / f"{name}_{digest.hexdigest()[:16]}{suffix}"
    except OSError as error:
        raise RuntimeError(f"{name}: no cache directory can be written ({error})") from error
    if not target.is_file():
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise RuntimeError(f"{name} needs a C compiler (cc); none found")
        if not Path(include, "Python.h").is_file():
            raise RuntimeError(f"{name} needs Python's headers ({include}/Python.h): this Python has none")
        import subprocess

        try:
            compile_into(name, [compiler, *flags, str(source)], target, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise RuntimeError(f"compiling {name} failed: {error}") from error
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None, f"{target} is not an extension module"
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        raise RuntimeError(f"{target} does not load: {error}") from error
    return module


def compile_into(name: str, command: list[str], target: Path, timeout: float | None = None) -> None:
    """Run a compiler's ``command`` (all but its output) to write ``target``: built in a scratch directory beside
    it, then moved in whole (atomic: a concurrent build never sees half a file). RuntimeError with the compiler's
    message when it fails."""
    import subprocess

    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run([*command, "-o", str(built)], capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"compiling {name} failed:\n{result.stderr[-4000:]}")
        built.replace(target)


@cache
def built(name: str, source: Path) -> ModuleType | RuntimeError:
    """``build_extension(name, source)``, or why it failed: tried once a process."""
    try:
        return build_extension(name, source)
    except RuntimeError as error:
        return error


@cache
def native_setting() -> str:
    """``MINIPAGED_NATIVE`` as the process started ("": unset), read once: a bulk profile asks at every bulk."""
    return os.environ.get("MINIPAGED_NATIVE", "")


def chosen(build: Callable[[], T | RuntimeError], source: str) -> T | None:
    """What ``build`` gives (the compiled code of the C file ``source``, or why it did not build) where it builds,
    unless ``MINIPAGED_NATIVE=0``; else None, and the Python reference serves, except under ``MINIPAGED_NATIVE=1``:
    then a RuntimeError with the compiler's message."""
    setting = native_setting()
    if setting == "0":
        return None
    compiled = build()
    if isinstance(compiled, RuntimeError):
        if setting == "1":
            raise RuntimeError(f"MINIPAGED_NATIVE=1, but {source} did not build: {compiled}")
        return None
    return compiled
