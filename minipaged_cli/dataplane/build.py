"""Host C++ built at run time into a shared library, cached per source version and CPU in ~/.cache/minipaged
(``native_build.cache_dir``): the CUDA kernels' CPU emulation (``emulation``) and the native CPU attention
(``native``)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
from pathlib import Path

from minipaged_cli.dataplane import kernels
from minipaged_cli.native_build import cache_dir, compile_into


def cpu_identity() -> str:
    """What ``-march=native`` compiles for: the CPU's vendor, model and instruction-set flags (Linux's
    /proc/cpuinfo, first processor), else the platform's machine and processor names."""
    identity = [platform.machine(), platform.processor()]
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        return " ".join(identity)
    keys = ("vendor_id", "cpu family", "model", "model name", "flags", "CPU implementer", "CPU part", "Features")
    identity += [line for line in first.splitlines() if line.split(":", 1)[0].strip() in keys]
    return "\n".join(identity)


def build_library(name: str, sources: tuple[str, ...], main: str, flags: list[str]) -> ctypes.CDLL:
    """Compile ``cuda/<main>`` (its version: the digest of ``sources``, ``flags`` and the CPU) with the host C++
    compiler unless already cached, and load it. RuntimeError when there is no compiler or the build fails.

    The CPU is in the key because a library built with ``-march=native`` on one CPU dies with SIGILL on an older
    one: a home directory shared by machines (Ray workers, a cluster's nodes) must not hand it over."""
    digest = hashlib.sha256(" ".join(flags).encode())
    digest.update(cpu_identity().encode())
    for source in sources:
        digest.update((kernels.CUDA_DIR / source).read_bytes())
    target = cache_dir() / f"{name}_{digest.hexdigest()[:16]}.so"
    if not target.is_file():
        compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
        if compiler is None:
            raise RuntimeError(f"{name} needs a C++20 compiler (g++); none found")
        compile_into(name, [compiler, *flags, "-shared", "-fPIC", str(kernels.CUDA_DIR / main)], target)
    return ctypes.CDLL(str(target))
