"""The library halves of ``run``, ``verify`` and ``profile``: the simulator and the data plane put to work, with
a paged Qwen3 for ``verify``."""
