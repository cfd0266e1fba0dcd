"""The data plane's storage: one K and one V tensor per layer, in blocks, shared block tables across layers."""

from __future__ import annotations

import torch


class PagedKVCache:
    """Per layer ``key_cache[layer]`` and ``value_cache[layer]``: [num_blocks, num_kv_heads, block_size, head_dim].

    Slot ``s`` of a layer is ``key_cache[layer][s // block_size, :, s % block_size, :]``; the block manager's
    block tables and slot mappings index every layer alike. The memory is left uninitialised (``torch.empty``):
    what was never written is never read, and the kernels must not assume it is zero.
    """

    def __init__(self, num_layers: int, num_blocks: int, num_kv_heads: int, block_size: int, head_dim: int,
                 dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu") -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("num_kv_heads", num_kv_heads),
                            ("block_size", block_size), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.key_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.value_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """[num_blocks, num_kv_heads, block_size, head_dim] of each layer's K (and V) tensor."""
        return tuple(self.key_cache[0].shape)  # type: ignore[return-value]

    @property
    def num_layers(self) -> int:
        return len(self.key_cache)

    @property
    def num_blocks(self) -> int:
        return self.shape[0]

    @property
    def block_size(self) -> int:
        return self.shape[2]

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def dtype(self) -> torch.dtype:
        return self.key_cache[0].dtype

    @property
    def device(self) -> torch.device:
        return self.key_cache[0].device

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token in every layer."""
        _, num_kv_heads, _, head_dim = self.shape
        return 2 * self.num_layers * num_kv_heads * head_dim * self.key_cache[0].element_size()

    @property
    def memory_bytes(self) -> int:
        """The footprint of every layer's K and V tensors."""
        return sum(t.numel() * t.element_size() for t in (*self.key_cache, *self.value_cache))
