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
from minipaged_cli.dataplane.kernel_backend import Dim3, KernelBackend


def cuda_backend_unavailable_reason() -> str | None:
    """Why the CUDA backend cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "torch sees no GPU"
    try:
        import pycuda  # noqa: F401
    except ImportError:
        return 'PyCUDA is not installed (pip install -e ".[gpu]")'
    return None


class CudaBackend(KernelBackend):
    name = "cuda"

    def __init__(self, device_index: int = 0) -> None:
        torch.cuda.init()  # torch owns the primary context; PyCUDA attaches to it below
        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)
        import pycuda.autoprimaryctx  # noqa: F401
        from pycuda.compiler import SourceModule

        properties = torch.cuda.get_device_properties(self.device)
        self.num_sms = properties.multi_processor_count
        self.capability = (properties.major, properties.minor)
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

    def launch(self, source: str, name: str, grid: Dim3, block: Dim3, args: list[kernels.KernelArg]) -> None:
        function = self._function(source, name, kernels.argument_types(args))
        with self._on_torch_stream():
            function.prepared_call(grid, block, *kernels.convert_args(args, np.uintp, np.int64, np.float32, np.int32))

    @contextmanager
    def _on_torch_stream(self) -> Iterator[None]:
        """Order the launch inside (on the legacy default stream) with torch's current stream: after the work
        already queued on it, before the work queued on it later. GPU-side waits; nothing when they are the same."""
        current, legacy = torch.cuda.current_stream(self.device), torch.cuda.default_stream(self.device)
        if current == legacy:
            yield
            return
        legacy.wait_stream(current)
        yield
        current.wait_stream(legacy)

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

