"""How KV offloading's gather and scatter run on each backend (``dataplane/offload.py`` calls them): whole blocks
of every layer's K and V into a contiguous staging buffer, and back.

    staging   [num_blocks, num_layers, 2 (K, V), num_kv_heads, block_size, head_dim]   on the cache's device
    block_ids int64 [num_blocks]                                                       distinct for a scatter
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from minipaged_cli.dataplane.backends import Backend
from minipaged_cli.dataplane.kv_cache import PagedKVCache

OFFLOAD_THREADS = 128  # threads per (block, layer, K or V) of the gather and scatter kernels


class TorchMover:
    """Gather and scatter with torch's indexing (the torch backend, on any device)."""

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache

    def gather(self, block_ids: torch.Tensor) -> torch.Tensor:
        """block_ids int64 [n] -> staging [n, num_layers, 2, num_kv_heads, block_size, head_dim]."""
        cache = self.cache
        staging = staging_buffer(cache, len(block_ids))
        for layer in range(cache.num_layers):
            staging[:, layer, 0] = cache.key_cache[layer].index_select(0, block_ids)
            staging[:, layer, 1] = cache.value_cache[layer].index_select(0, block_ids)
        return staging

    def scatter(self, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
        """staging [n, num_layers, 2, ...] -> the blocks ``block_ids`` (distinct) of every layer."""
        cache = self.cache
        for layer in range(cache.num_layers):
            _bits(cache.key_cache[layer]).index_copy_(0, block_ids, _bits(staging[:, layer, 0]))
            _bits(cache.value_cache[layer]).index_copy_(0, block_ids, _bits(staging[:, layer, 1]))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """An fp8 cache as its bytes: torch's index_copy_ has no fp8 kernel on the CPU, and a copy moves bits anyway."""
    return tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor


class KernelMover:
    """Gather and scatter by the kernels of ``cuda/offload.cu``, launched through a kernel backend."""

    def __init__(self, launcher: Any, cache: PagedKVCache) -> None:
        self.launcher = launcher  # a KernelBackend whose launch() reaches offload.cu's entry points
        self.cache = cache
        caches = (*cache.key_cache, *cache.value_cache)
        # [2, num_layers] int64: every layer's K cache's address, then every layer's V cache's
        self.pointers = torch.tensor([t.data_ptr() for t in caches], dtype=torch.int64, device=cache.device)
        self.block_bytes = caches[0][0].numel() * caches[0].element_size()
        self.aligned = self.block_bytes % 16 == 0 and all(t.data_ptr() % 16 == 0 for t in caches)

    def gather(self, block_ids: torch.Tensor) -> torch.Tensor:
        staging = staging_buffer(self.cache, len(block_ids))
        self._launch("gather_blocks", block_ids, staging)
        return staging

    def scatter(self, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
        self._launch("scatter_blocks", block_ids, staging)

    def _launch(self, name: str, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
        from minipaged_cli.dataplane.kernels import Int64

        vectorized = self.aligned and staging.data_ptr() % 16 == 0
        self.launcher.launch("offload", name, (len(block_ids), self.cache.num_layers, 2), (OFFLOAD_THREADS, 1, 1),
                             [staging, self.pointers, block_ids, self.cache.num_layers, Int64(self.block_bytes),
                              int(vectorized)])


def staging_buffer(cache: PagedKVCache, num_blocks: int) -> torch.Tensor:
    """[num_blocks, num_layers, 2, num_kv_heads, block_size, head_dim] on the cache's device, unwritten."""
    return torch.empty((num_blocks, cache.num_layers, 2, *cache.shape[1:]), dtype=cache.dtype, device=cache.device)


def block_mover(backend: Backend, cache: PagedKVCache) -> TorchMover | KernelMover:
    """The torch backend gathers with torch; the kernel backends launch offload.cu (the emulated one through a
    library of its own, built beside the others')."""
    from minipaged_cli.dataplane.kernel_backend import KernelBackend

    if not isinstance(backend, KernelBackend):
        return TorchMover(cache)
    return KernelMover(emulated_launcher() if backend.device.type == "cpu" else backend, cache)


@functools.cache
def emulated_launcher() -> Backend:
    from minipaged_cli.dataplane.build import build_library
    from minipaged_cli.dataplane.emulation import FLAGS, EmulatedBackend

    library = build_library("offload_emu", ("emulation/offload_emu.cpp", "emulation/cuda_emu.h", "offload.cu",
                                            "common.cuh"), "emulation/offload_emu.cpp", FLAGS)
    return EmulatedBackend(library=library)
