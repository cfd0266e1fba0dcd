"""The data plane's storage: one K and one V tensor per layer, in blocks, shared block tables across layers."""

from __future__ import annotations

import torch

from minipaged_cli.dataplane.fp8 import amax_scale, is_fp8
from minipaged_cli.dataplane.kv_scales import DEFAULT_SCALE_MODE, check_scale_mode


class PagedKVCache:
    """Per layer ``key_cache[layer]`` and ``value_cache[layer]``: [num_blocks, num_kv_heads, block_size, head_dim].

    Slot ``s`` of a layer is ``key_cache[layer][s // block_size, :, s % block_size, :]``; the block manager's
    block tables and slot mappings index every layer alike. The memory is left uninitialised (``torch.empty``):
    what was never written is never read, and the kernels must not assume it is zero.

    An fp8 ``dtype`` (float8_e4m3fn, float8_e5m2) also keeps per layer ``k_scales[layer]``, ``v_scales[layer]``
    float32 [num_kv_heads], fixed by ``scale_mode`` (``dataplane/fp8.py``) at the layer's first write and never
    changed after: every element of a layer is stored with the scales it is read with.
    """

    def __init__(self, num_layers: int, num_blocks: int, num_kv_heads: int, block_size: int, head_dim: int,
                 dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                 scale_mode: str = DEFAULT_SCALE_MODE) -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("num_kv_heads", num_kv_heads),
                            ("block_size", block_size), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.key_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.value_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.scale_mode = check_scale_mode(scale_mode)
        ones = torch.ones(num_kv_heads, dtype=torch.float32, device=device)
        self.k_scales = [ones.clone() for _ in range(num_layers)]
        self.v_scales = [ones.clone() for _ in range(num_layers)]
        self._calibrated = [scale_mode == "one"] * num_layers

    @property
    def quantized(self) -> bool:
        return is_fp8(self.dtype)

    def scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(k_scale, v_scale) of the layer as the backends take them: None for a cache that is not fp8."""
        if not self.quantized:
            return None, None
        return self.k_scales[layer], self.v_scales[layer]

    def scales_for_write(self, layer: int, key: torch.Tensor,
                         value: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The layer's scales for writing key, value [num_tokens, num_kv_heads, head_dim]: from their amax when
        this is the layer's first write (``tensor``, ``head``), the fixed ones after."""
        if self.quantized and not self._calibrated[layer] and key.shape[0]:
            self.calibrate(layer, key, value)
        return self.scales(layer)

    def calibrate(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Fix the layer's scales from the amax of key, value [num_tokens, num_kv_heads, head_dim] (per tensor or
        per head, as ``scale_mode``; ``one`` keeps 1.0), before its first write: calibrated on data that holds
        every value the layer will store, no stored value saturates."""
        if self.scale_mode != "one":
            per_head = self.scale_mode == "head"
            self.k_scales[layer] = amax_scale(key, self.dtype, per_head)
            self.v_scales[layer] = amax_scale(value, self.dtype, per_head)
        self._calibrated[layer] = True

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
