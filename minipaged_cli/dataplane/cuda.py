"""The CUDA kernels of ``cuda/`` on a GPU, through PyCUDA (an optional extra: ``pip install -e ".[gpu]"``).

torch initialises CUDA first; PyCUDA then attaches to the same primary context (``pycuda.autoprimaryctx``), so
kernels run on torch tensors' memory (``data_ptr``), timed with CUDA events. The kernels are launched on the
legacy default stream; when torch's current stream is another one, the launches are ordered after the work
queued on it, and its later work after them, with stream waits on the GPU (no host synchronisation). Each ``.cu``
is compiled once per process by ``SourceModule`` (``no_extern_c``: the files declare their own ``extern "C"``
entry points) for the device's architecture; launches are prepared calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from minipaged_cli.dataplane import kernels
from minipaged_cli.dataplane.backends import Backend

_ATTENTION_ARGS = "PPPPPPPPPfiiiiii"  # out, query, key_cache, value_cache, block_tables, seq_lens, tmp x3, scale, ints
_MERGE_ARGS = "PPPPPiii"
_CACHE_WRITE_ARGS = "PPPPPqqiiii"
_COPY_BLOCKS_ARGS = "PPPqi"


def cuda_backend_unavailable_reason() -> str | None:
    """Why the CUDA backend cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "torch sees no GPU"
    try:
        import pycuda  # noqa: F401
    except ImportError:
        return 'PyCUDA is not installed (pip install -e ".[gpu]")'
    return None


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, device_index: int = 0) -> None:
        torch.cuda.init()  # torch owns the primary context; PyCUDA attaches to it below
        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)
        import pycuda.autoprimaryctx  # noqa: F401
        from pycuda.compiler import SourceModule

        properties = torch.cuda.get_device_properties(self.device)
        self.num_sms = properties.multi_processor_count
        self.arch = f"sm_{properties.major}{properties.minor}"
        self._source_module = SourceModule
        self._modules: dict[str, Any] = {}
        self._functions: dict[str, Any] = {}

    def _function(self, source: str, name: str, argument_types: str) -> Any:
        """Kernel ``name`` of ``cuda/<source>.cu``, the module compiled once, the call prepared once."""
        if name not in self._functions:
            if source not in self._modules:
                self._modules[source] = self._source_module(
                    (kernels.CUDA_DIR / f"{source}.cu").read_text(), no_extern_c=True, arch=self.arch,
                    include_dirs=[str(kernels.CUDA_DIR)], options=["-O3"])
            function = self._modules[source].get_function(name)
            function.prepare(argument_types)
            self._functions[name] = function
        return self._functions[name]

    def _cache_write(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                     value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if key.shape[0] == 0:
            return
        key, value, vectorized = kernels.cache_write_operands(key, value, key_cache, value_cache)
        function = self._function("cache_write", kernels.cache_write_kernel(key.dtype), _CACHE_WRITE_ARGS)
        with self._on_torch_stream():
            function.prepared_call((key.shape[0], 1, 1), (kernels.CACHE_WRITE_THREADS, 1, 1),
                                   *_numpy(kernels.cache_write_args(key, value, key_cache, value_cache, slot_mapping,
                                                                    vectorized)))

    def _copy_blocks(self, key_cache: torch.Tensor, value_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
        function = self._function("copy_blocks", "copy_blocks", _COPY_BLOCKS_ARGS)
        with self._on_torch_stream():
            function.prepared_call((block_mapping.shape[0], 1, 1), (kernels.COPY_BLOCKS_THREADS, 1, 1),
                                   *_numpy(kernels.copy_blocks_args(key_cache, value_cache, block_mapping)))

    def _paged_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
        # One host sync for the longest sequence: it sizes the split plan (launch_attention takes it known).
        query = kernels.attention_operands(query, key_cache, value_cache)
        return self.launch_attention(query, key_cache, value_cache, block_tables.contiguous(),
                                     seq_lens.contiguous(), scale, int(seq_lens.max()))

    def launch_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                         max_seq_len: int) -> torch.Tensor:
        """The launches alone, unvalidated and without a host sync: contiguous, aligned arguments, checked already
        (a non-empty batch)."""
        batch, num_q_heads, head_dim = query.shape
        num_kv_heads = key_cache.shape[1]
        plan = kernels.plan_attention(query, num_kv_heads, max_seq_len, self.num_sms)
        attention = self._function("paged_attention", kernels.attention_kernel(query.dtype, head_dim, plan.group),
                                   _ATTENTION_ARGS)
        with self._on_torch_stream():
            attention.prepared_call((num_kv_heads, batch, plan.num_splits), (kernels.NUM_THREADS, 1, 1),
                                    *_numpy(kernels.attention_args(plan, query, key_cache, value_cache, block_tables,
                                                                   seq_lens, scale)))
            if plan.num_splits > 1:
                merge = self._function("paged_attention", kernels.merge_kernel(query.dtype, head_dim), _MERGE_ARGS)
                merge.prepared_call((num_q_heads, batch, 1), (head_dim, 1, 1),
                                    *_numpy(kernels.merge_args(plan, seq_lens)))
        return plan.out

    @contextmanager
    def _on_torch_stream(self) -> Iterator[None]:
        """Order the launches inside (on the legacy default stream) with torch's current stream: after the work
        already queued on it, before the work queued on it later. GPU-side waits; nothing when they are the same."""
        current, legacy = torch.cuda.current_stream(self.device), torch.cuda.default_stream(self.device)
        if current == legacy:
            yield
            return
        legacy.wait_stream(current)
        yield
        current.wait_stream(legacy)

    def unsupported(self, num_q_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
        return kernels.unsupported_reason(head_dim, num_q_heads // num_kv_heads)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def timed(self, call: Callable[[], Any]) -> tuple[Any, float]:
        """CUDA events around the call on the current stream: device time, not host time."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = call()
        end.record()
        end.synchronize()
        return result, start.elapsed_time(end) / 1e3


def _numpy(args: list[kernels.KernelArg]) -> list[object]:
    """Kernel arguments as PyCUDA's prepared calls take them (types matching _*_ARGS)."""
    return kernels.convert_args(args, np.uintp, np.int64, np.float32, np.int32)
