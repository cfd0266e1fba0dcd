"""Which backend runs the data plane: ``--device auto|cpu|cuda|emulated``.

PyCUDA and the emulation's compiler are touched only when asked for, so that everything else works without them.
"""

from __future__ import annotations

import warnings

import torch

from minipaged_cli.dataplane.backends import Backend, TorchBackend
from minipaged_cli.errors import InputError
from minipaged_cli.extras import FallbackWarning

DEVICES = ("auto", "cpu", "cuda", "emulated")


def select_backend(device: str) -> Backend:
    """``auto``: the CUDA kernels when a GPU and PyCUDA are there, else the CPU (with a ``FallbackWarning`` saying
    why when a GPU is there); ``cpu`` (the PyTorch reference); ``cuda`` (one clear error when it cannot run);
    ``emulated`` (the CUDA kernels on the CPU)."""
    if device not in DEVICES:
        raise InputError(f"expected one of {', '.join(DEVICES)}", field="{device}", value=device, has_value=True)
    if device == "emulated":
        from minipaged_cli.dataplane.emulation import EmulatedBackend

        return EmulatedBackend()
    if device == "cpu":
        return TorchBackend("cpu")
    from minipaged_cli.dataplane.cuda import CudaBackend, cuda_backend_unavailable_reason

    reason = cuda_backend_unavailable_reason()
    if reason is None:
        return CudaBackend()
    if device == "auto":
        if torch.cuda.is_available():  # the user has a GPU and would expect it used: say why it is not
            warnings.warn(FallbackWarning(f"{{device=auto}} runs on the CPU: a GPU is here but {reason}"),
                          stacklevel=2)
        return TorchBackend("cpu")
    raise InputError(f"the CUDA backend cannot run: {reason}; use {{device=cpu}} or emulated", field="{device}",
                     value=device, has_value=True)
