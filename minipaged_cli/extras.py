"""The optional dependencies (pyproject.toml's extras): which extra brings each module, so that a command that needs
a missing one says what to install. ``simulate``, ``sweep``, ``convert`` and ``profile --device none`` need none.
"""

from __future__ import annotations

# The top-level module -> the extra that installs it.
EXTRAS = {
    "torch": "torch",
    "transformers": "torch",
    "safetensors": "torch",
    "pycuda": "gpu",
    "ray": "ray",
    "matplotlib": "plot",
}
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


class FallbackWarning(UserWarning):
    """A command goes on, but not as asked: something optional is missing and a fallback serves (the command line
    shows it as one 'note:' line on stderr)."""


def needs(module: str) -> str:
    """'needs MODULE, which is not installed: how to install it' for ``module``, one of ``EXTRAS``."""
    line = f'needs {module}, which is not installed: pip install -e ".[{EXTRAS[module]}]"'
    if EXTRAS[module] == "torch":
        line += f" (on a machine without a GPU, first: {CPU_TORCH})"
    return line


def missing_extra(error: BaseException) -> str | None:
    """``needs(...)`` when ``error`` is an optional dependency that is not installed; None for anything else (a
    missing dependency of an installed package is a broken install, not a missing extra)."""
    if not isinstance(error, ModuleNotFoundError) or error.name not in EXTRAS:
        return None
    return needs(error.name)
