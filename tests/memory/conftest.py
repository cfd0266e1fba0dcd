"""The memory plane's loops under test: a module marked ``LOOP_KINDS`` runs each test with the Python loops and
again with the compiled ones (``memory/pool_loops.py``: ``loops()`` and ``compiled()``); elsewhere a pool and a
bulk profile take what those give (compiled where the machine builds them)."""

from __future__ import annotations

from types import ModuleType
from typing import TypeVar

import pytest

from minipaged_cli.memory import pool_loops
from tests.conftest import REQUIRE_SHARED, skip_unless_required

T = TypeVar("T")
LOOP_KINDS = pytest.mark.parametrize("pool_loops_kind", ["python", "compiled"], indirect=True)


def usable(built: T | RuntimeError) -> T:
    """A compiled module (or what holds it) where it built; the test skips where this machine has no C compiler or no
    ``Python.h`` (fails in CI, and wherever a build ran and failed)."""
    if isinstance(built, RuntimeError):
        if "failed" in str(built):
            pytest.fail(str(built))
        skip_unless_required(str(built), REQUIRE_SHARED)
    assert not isinstance(built, RuntimeError)
    return built


def compiled() -> tuple[ModuleType, pool_loops.Loops]:
    """The compiled module and its loops (``usable``)."""
    return usable(pool_loops._compiled())


def compiled_loops() -> pool_loops.Loops:
    return compiled()[1]


@pytest.fixture(autouse=True)
def pool_loops_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    kind = getattr(request, "param", None)
    if kind == "python":
        monkeypatch.setattr(pool_loops, "loops", lambda: pool_loops.PYTHON)
        monkeypatch.setattr(pool_loops, "compiled", lambda: None)
    elif kind == "compiled":
        module, chosen = compiled()
        monkeypatch.setattr(pool_loops, "loops", lambda: chosen)
        monkeypatch.setattr(pool_loops, "compiled", lambda: module)
    return kind
