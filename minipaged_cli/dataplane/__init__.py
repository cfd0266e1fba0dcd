"""The data plane: the paged KV cache, the PyTorch references of its operations, and the backends that run them
(torch, and the CUDA kernels of ``cuda/`` through PyCUDA or the CPU emulation)."""
