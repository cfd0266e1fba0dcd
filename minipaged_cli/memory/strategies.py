"""The allocation strategies by name, and the factory the simulator builds them with."""

from __future__ import annotations

from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.contiguous import (
    DynamicAllocator,
    MaxReserveAllocator,
    OracleReserveAllocator,
    Pow2ReserveAllocator,
)
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.memory.paged import PagedAllocator

STRATEGIES = ("paged", "max-reserve", "pow2-reserve", "oracle-reserve", "dynamic")


def make_allocator(name: str, *, num_blocks: int, block_size: int, max_model_len: int,
                   prefix_caching: bool = False, groups: tuple[KVCacheGroup, ...] = (),
                   max_batched_tokens: int | None = None) -> Allocator:
    """``groups``: the model's KV cache groups (``kv_groups.py``; none: one full-attention group);
    ``max_batched_tokens`` caps a sliding window's admission count."""
    if name == "paged":
        return PagedAllocator(num_blocks, block_size, groups or None, prefix_caching=prefix_caching,
                              max_in_flight_tokens=max_batched_tokens or max_model_len, max_model_len=max_model_len)
    contiguous = {
        "max-reserve": MaxReserveAllocator,
        "pow2-reserve": Pow2ReserveAllocator,
        "oracle-reserve": OracleReserveAllocator,
        "dynamic": DynamicAllocator,
    }
    return contiguous[name](num_blocks * block_size, max_model_len, groups)
