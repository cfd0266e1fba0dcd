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
from minipaged_cli.dataplane.backends import Backend

_SOURCES = ("emulation/kernels_emu.cpp", "emulation/cuda_emu.h", "cache_write.cu", "paged_attention.cu",
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


def _ctypes(args: list[kernels.KernelArg]) -> list[object]:
    return kernels.convert_args(args, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int)


class EmulatedBackend(Backend):
    """The CUDA kernels executed on the CPU (one OS thread per CUDA thread). For tests and debugging."""

    name = "emulated"

    def __init__(self, tokens_per_split: int | None = None, num_sms: int = 132) -> None:
        self.device = torch.device("cpu")
        self.tokens_per_split = tokens_per_split  # None: the GPU's plan for an H200-sized GPU (num_sms)
        self.num_sms = num_sms
        self.library = load_library()

    def _cache_write(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                     value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if key.shape[0] == 0:
            return
        key, value, vectorized = kernels.cache_write_operands(key, value, key_cache, value_cache)
        function = getattr(self.library, "emu_" + kernels.cache_write_kernel(key.dtype))
        function(ctypes.c_uint(key.shape[0]), ctypes.c_uint(kernels.CACHE_WRITE_THREADS),
                 *_ctypes(kernels.cache_write_args(key, value, key_cache, value_cache, slot_mapping, vectorized)))

    def _copy_blocks(self, key_cache: torch.Tensor, value_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
        self.library.emu_copy_blocks(ctypes.c_uint(block_mapping.shape[0]), ctypes.c_uint(kernels.COPY_BLOCKS_THREADS),
                                     *_ctypes(kernels.copy_blocks_args(key_cache, value_cache, block_mapping)))

    def _paged_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
        batch, num_q_heads, head_dim = query.shape
        num_kv_heads = key_cache.shape[1]
        query = kernels.attention_operands(query, key_cache, value_cache)
        block_tables, seq_lens = block_tables.contiguous(), seq_lens.contiguous()
        plan = kernels.plan_attention(query, num_kv_heads, int(seq_lens.max()), self.num_sms, self.tokens_per_split)
        function = getattr(self.library, "emu_" + kernels.attention_kernel(query.dtype, head_dim, plan.group))
        function(ctypes.c_uint(num_kv_heads), ctypes.c_uint(batch), ctypes.c_uint(plan.num_splits),
                 *_ctypes(kernels.attention_args(plan, query, key_cache, value_cache, block_tables, seq_lens, scale)))
        if plan.num_splits > 1:
            merge = getattr(self.library, "emu_" + kernels.merge_kernel(query.dtype, head_dim))
            merge(ctypes.c_uint(num_q_heads), ctypes.c_uint(batch), *_ctypes(kernels.merge_args(plan, seq_lens)))
        return plan.out

    def unsupported(self, num_q_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
        return kernels.unsupported_reason(head_dim, num_q_heads // num_kv_heads)

    def synchronize(self) -> None:
        """Emulated launches finish before they return."""
