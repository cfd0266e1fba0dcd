"""The allocation strategies by name, and the factory the simulator builds them with."""

from __future__ import annotations

from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.contiguous import (
    DynamicAllocator,
    MaxReserveAllocator,
    OracleReserveAllocator,
    Pow2ReserveAllocator,
)
from minipaged_cli.memory.hybrid_paged import HybridPagedAllocator
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.memory.paged import PagedAllocator

STRATEGIES = ("paged", "max-reserve", "pow2-reserve", "oracle-reserve", "dynamic")


def make_allocator(name: str, *, num_blocks: int, block_size: int, max_model_len: int,
                   prefix_caching: bool = False, watermark_blocks: int = 0, scheduler: str = "v1",
                   groups: tuple[KVCacheGroup, ...] = (), max_batched_tokens: int | None = None) -> Allocator:
    """``groups``: the model's KV cache groups (``kv_groups.py``); more than one, or a sliding one, pages through
    the hybrid manager (vLLM v1 only: ``max_batched_tokens`` caps a window's admission count)."""
    capacity = num_blocks * block_size
    if name == "paged" and (len(groups) > 1 or any(g.is_sliding for g in groups)):
        return HybridPagedAllocator(num_blocks, block_size, groups, prefix_caching=prefix_caching,
                                    watermark_blocks=watermark_blocks,
                                    max_in_flight_tokens=max_batched_tokens or max_model_len,
                                    max_model_len=max_model_len)
    if name == "paged":
        return PagedAllocator(num_blocks, block_size, prefix_caching=prefix_caching,
                              watermark_blocks=watermark_blocks, scheduler=scheduler)
    contiguous = {
        "max-reserve": MaxReserveAllocator,
        "pow2-reserve": Pow2ReserveAllocator,
        "oracle-reserve": OracleReserveAllocator,
        "dynamic": DynamicAllocator,
    }
    return contiguous[name](capacity, max_model_len, groups)
