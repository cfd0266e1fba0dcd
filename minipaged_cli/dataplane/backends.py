"""Backends run the data plane's two operations on one device and time them.

The interface is what ``minipaged run`` and the kernels' tests call: ``cache_write``, ``paged_attention``,
``copy_blocks``, ``synchronize``, and ``timed`` (seconds of device time). Every call is validated first (shapes,
dtypes, devices, block ids, sequence lengths): a bad argument is a ``ValueError``, never an out-of-range read.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from minipaged_cli.dataplane.reference import (
    cache_write,
    check_cache_write,
    check_copy_blocks,
    check_paged_attention,
    copy_blocks,
    paged_attention_vectorized,
)

WARMUP_CALLS = 2  # untimed calls before a kernel's timed ones, at every size it is timed at


class Backend(ABC):
    name: str
    device: torch.device

    def cache_write(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> None:
        """key, value [num_tokens, num_kv_heads, head_dim] -> the caches at ``slot_mapping`` [num_tokens] (-1: skip);
        an fp8 cache stores them quantized by k_scale, v_scale float32 [num_kv_heads] (``dataplane/fp8.py``)."""
        check_cache_write(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
        self._cache_write(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)

    def paged_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                        k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
        """query [batch, num_q_heads, head_dim] over the cached K/V -> out [batch, num_q_heads, head_dim], the
        query's dtype; an fp8 cache's K and V are read back multiplied by k_scale, v_scale [num_kv_heads]."""
        check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, k_scale, v_scale)
        if query.shape[0] == 0:  # nothing to launch (a kernel grid cannot be empty)
            return torch.empty_like(query)
        return self._paged_attention(query, key_cache, value_cache, block_tables, seq_lens, scale, k_scale, v_scale)

    def copy_blocks(self, key_cache: torch.Tensor, value_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
        """Copy whole blocks of one layer's caches: block_mapping int64 [num_pairs, 2] of (src, dst)."""
        check_copy_blocks(key_cache, value_cache, block_mapping)
        if block_mapping.shape[0]:
            self._copy_blocks(key_cache, value_cache, block_mapping.contiguous())

    @abstractmethod
    def _copy_blocks(self, key_cache: torch.Tensor, value_cache: torch.Tensor, block_mapping: torch.Tensor) -> None: ...

    @abstractmethod
    def _cache_write(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                     value_cache: torch.Tensor, slot_mapping: torch.Tensor, k_scale: torch.Tensor | None,
                     v_scale: torch.Tensor | None) -> None: ...

    @abstractmethod
    def _paged_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                         k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> torch.Tensor: ...

    @abstractmethod
    def synchronize(self) -> None: ...

    def unsupported(self, num_q_heads: int, num_kv_heads: int, head_dim: int,
                    kv_cache_dtype: str = "auto") -> str | None:
        """Why this backend cannot run attention of that shape with that ``--kv-cache-dtype``, or None when it can."""
        return None

    def median_seconds(self, call: Callable[[], Any], repeat: int) -> float:
        """The median device time of ``repeat`` calls, after ``WARMUP_CALLS`` untimed ones.

        More than one: after a single warm-up a CPU once timed one token's element-wise work at 3.2 ms and 64
        tokens' at 0.32 ms, and under ``--repeat 1`` no median keeps such a call out of the table."""
        for _ in range(WARMUP_CALLS):
            call()
        times = sorted(self.timed(call)[1] for _ in range(repeat))
        return times[len(times) // 2]

    def clock(self) -> float:
        """Seconds on the host's clock; tests put a deterministic clock here."""
        return time.perf_counter()

    def timed(self, call: Callable[[], Any]) -> tuple[Any, float]:
        """Run ``call``; return its result and the seconds it took on the device."""
        self.synchronize()
        start = self.clock()
        result = call()
        self.synchronize()
        return result, self.clock() - start


class TorchBackend(Backend):
    """The PyTorch reference implementations, on the CPU (or any device torch runs on)."""

    name = "torch"

    def __init__(self, device: str | torch.device = "cpu", native: bool = True) -> None:
        self.device = torch.device(device)
        self.native = native  # on a CPU, decode attention through dataplane/native.py when it builds

    def _cache_write(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                     value_cache: torch.Tensor, slot_mapping: torch.Tensor, k_scale: torch.Tensor | None,
                     v_scale: torch.Tensor | None) -> None:
        cache_write(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)

    def _copy_blocks(self, key_cache: torch.Tensor, value_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
        copy_blocks(key_cache, value_cache, block_mapping)

    def _paged_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                         k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> torch.Tensor:
        if self.device.type == "cpu" and self.native:
            from minipaged_cli.dataplane.native import native_attention_available, paged_attention_native

            if native_attention_available():  # one pass over K/V in C++, built once where a compiler is
                return paged_attention_native(query, key_cache, value_cache, block_tables, seq_lens, scale,
                                              k_scale, v_scale)
        return paged_attention_vectorized(query, key_cache, value_cache, block_tables, seq_lens, scale, k_scale,
                                          v_scale)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
