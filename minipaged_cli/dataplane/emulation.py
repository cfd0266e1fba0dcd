"""The CUDA kernels of ``cuda/``, compiled for the CPU against ``cuda/emulation/cuda_emu.h`` and run through
ctypes: the same source as on a GPU, slow but exact. ``--device emulated``; and the kernels' tests in CI."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from minipaged_cli.dataplane import kernels
from minipaged_cli.dataplane.kernel_backend import Dim3, KernelBackend

_SOURCES = ("emulation/kernels_emu.cpp", "emulation/cuda_emu.h", "cache_write.cu", "paged_attention.cu",
            "paged_attention_tc.cu",
            "copy_blocks.cu", "common.cuh")


def _cache_dir() -> Path:
    """~/.cache/minipaged (or $XDG_CACHE_HOME), or the temporary directory where home is not writable."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "minipaged"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        base = Path(tempfile.gettempdir()) / f"minipaged-{os.getuid()}"
        base.mkdir(parents=True, exist_ok=True)
    return base


@cache
def load_library() -> ctypes.CDLL:
    """Compile (once per source version, cached in ~/.cache/minipaged) and load the emulated kernels."""
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((kernels.CUDA_DIR / name).read_bytes())
    target = _cache_dir() / f"kernels_emu_{digest.hexdigest()[:16]}.so"
    if not target.is_file():
        compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
        if compiler is None:
            raise RuntimeError("the emulated kernels need a C++20 compiler (g++); none found")
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = Path(scratch) / target.name
            command = [compiler, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-DMINIPAGED_EMULATION",
                       str(kernels.CUDA_DIR / "emulation" / "kernels_emu.cpp"), "-o", str(built)]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"compiling the emulated kernels failed:\n{result.stderr[-4000:]}")
            built.replace(target)  # atomic: a concurrent build never sees half a file
    return ctypes.CDLL(str(target))


class EmulatedBackend(KernelBackend):
    """The CUDA kernels executed on the CPU (one OS thread per CUDA thread). For tests and debugging."""

    name = "emulated"

    def __init__(self, tokens_per_split: int | None = None, num_sms: int = 132,
                 attention_variant: str = "auto") -> None:
        self.device = torch.device("cpu")
        self.tokens_per_split = tokens_per_split  # None: the GPU's plan for an H200-sized GPU (num_sms)
        self.num_sms = num_sms
        self.attention_variant = attention_variant
        self.library = load_library()

    def launch(self, source: str, name: str, grid: Dim3, block: Dim3, args: list[kernels.KernelArg]) -> None:
        shape = [ctypes.c_uint(n) for n in (*grid, *block)]
        getattr(self.library, "emu_" + name)(*shape, *kernels.convert_args(args, ctypes.c_void_p, ctypes.c_int64,
                                                                           ctypes.c_float, ctypes.c_int))

    def synchronize(self) -> None:
        """Emulated launches finish before they return."""
