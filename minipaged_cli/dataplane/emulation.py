"""The CUDA kernels of ``cuda/``, compiled for the CPU against ``cuda/emulation/cuda_emu.h`` and run through
ctypes: the same source as on a GPU, slow but exact, under the GPU's memory rules (a kernel that breaks one fails
with EmulationError naming it). ``--device emulated``; and the kernels' tests in CI."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from minipaged_cli.dataplane import kernels
from minipaged_cli.dataplane.build import build_library
from minipaged_cli.dataplane.kernel_backend import Dim3, KernelBackend

_SOURCES = ("emulation/kernels_emu.cpp", "emulation/cuda_emu.h", "host/fp8.h", "cache_write.cu",
            "paged_attention.cu", "paged_attention_tc.cu", "copy_blocks.cu", "common.cuh")


FLAGS = ["-std=c++20", "-O1", "-pthread", "-DMINIPAGED_EMULATION"]


class EmulationError(RuntimeError):
    """A kernel broke one of the GPU's rules the emulation keeps (cuda_emu.h): a missing barrier, a cp.async read
    before it landed, lanes at different collectives... The message names the rule and the call site."""


@cache
def load_library() -> ctypes.CDLL:
    """Compile (once per source version, cached in ~/.cache/minipaged) and load the emulated kernels."""
    return build_library("kernels_emu", _SOURCES, "emulation/kernels_emu.cpp", FLAGS)


class EmulatedBackend(KernelBackend):
    """The CUDA kernels executed on the CPU (one OS thread per CUDA thread). For tests and debugging."""

    name = "emulated"

    def __init__(self, tokens_per_split: int | None = None, num_sms: int = 132,
                 attention_variant: str = "auto", library: ctypes.CDLL | None = None,
                 capability: tuple[int, int] = (9, 0)) -> None:
        self.device = torch.device("cpu")
        self.tokens_per_split = tokens_per_split  # None: the GPU's plan for an H200-sized GPU (num_sms)
        self.num_sms = num_sms
        self.capability = capability  # the GPU emulated (an H200's sm_90) decides what it refuses
        self.attention_variant = attention_variant
        self.library = library or load_library()  # another build of the kernels: the mutation tests'
        self.library.emu_take_error.restype = ctypes.c_char_p

    def launch(self, source: str, name: str, grid: Dim3, block: Dim3, args: list[kernels.KernelArg]) -> None:
        shape = [ctypes.c_uint(n) for n in (*grid, *block)]
        getattr(self.library, "emu_" + name)(*shape, *kernels.convert_args(args, ctypes.c_void_p, ctypes.c_int64,
                                                                           ctypes.c_float, ctypes.c_int))
        error = self.library.emu_take_error().decode()
        if error:
            raise EmulationError(f"{name}: {error}")

    def synchronize(self) -> None:
        """Emulated launches finish before they return."""
