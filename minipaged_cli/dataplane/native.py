"""Decode paged attention on the CPU in one pass over K/V (``cuda/host/paged_attention_cpu.cpp``): what the torch
backend runs on a CPU when a C++ compiler is there (built once, cached), instead of the gather-and-GEMM reference.
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from minipaged_cli.dataplane.build import build_library

_SOURCES = ("host/paged_attention_cpu.cpp", "host/fp8.h")
_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float8_e4m3fn: 3, torch.float8_e5m2: 4}


@cache
def _library() -> ctypes.CDLL | None:
    try:
        return build_library("attention_cpu", _SOURCES, _SOURCES[0], ["-std=c++20", "-O3", "-march=native",
                                                                        "-fopenmp-simd", "-pthread"])
    except RuntimeError:
        return None  # no compiler: the reference serves


def native_attention_available() -> bool:
    return _library() is not None


def paged_attention_native(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The same contract as ``reference.paged_attention_naive`` (checked arguments, CPU tensors)."""
    library = _library()
    assert library is not None, "check native_attention_available() first"
    batch, num_q_heads, head_dim = query.shape
    _, num_kv_heads, block_size, _ = key_cache.shape
    query, key_cache, value_cache = query.contiguous(), key_cache.contiguous(), value_cache.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    out = torch.empty(batch, num_q_heads, head_dim, dtype=torch.float32)
    library.paged_attention_cpu(
        ctypes.c_void_p(query.data_ptr()), ctypes.c_void_p(key_cache.data_ptr()),
        ctypes.c_void_p(value_cache.data_ptr()), ctypes.c_void_p(block_tables.data_ptr()),
        ctypes.c_void_p(seq_lens.data_ptr()), _pointer(k_scale), _pointer(v_scale),
        ctypes.c_void_p(out.data_ptr()), ctypes.c_int(batch),
        ctypes.c_int(num_kv_heads), ctypes.c_int(num_q_heads // num_kv_heads), ctypes.c_int(block_size),
        ctypes.c_int(head_dim), ctypes.c_int(block_tables.shape[1]), ctypes.c_float(scale),
        ctypes.c_int(torch.get_num_threads()), ctypes.c_int(_KINDS[query.dtype]), ctypes.c_int(_KINDS[key_cache.dtype]))
    return out.to(query.dtype)


def _pointer(tensor: torch.Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if tensor is None else tensor.data_ptr())
