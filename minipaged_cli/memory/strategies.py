"""The allocation strategies by name, and the factory the simulator builds them with."""

from __future__ import annotations

from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.contiguous import (
    DynamicAllocator,
    MaxReserveAllocator,
    OracleReserveAllocator,
    Pow2ReserveAllocator,
)
from minipaged_cli.memory.paged import PagedAllocator

STRATEGIES = ("paged", "max-reserve", "pow2-reserve", "oracle-reserve", "dynamic")


def make_allocator(name: str, *, num_blocks: int, block_size: int, max_model_len: int,
                   prefix_caching: bool = False, watermark_blocks: int = 0, scheduler: str = "v1") -> Allocator:
    capacity = num_blocks * block_size
    if name == "paged":
        return PagedAllocator(num_blocks, block_size, prefix_caching=prefix_caching,
                              watermark_blocks=watermark_blocks, scheduler=scheduler)
    contiguous = {
        "max-reserve": MaxReserveAllocator,
        "pow2-reserve": Pow2ReserveAllocator,
        "oracle-reserve": OracleReserveAllocator,
        "dynamic": DynamicAllocator,
    }
    return contiguous[name](capacity, max_model_len)
