"""The block pool's loops under test: a module that marks ``pool_loops_kind`` with ``indirect=True`` runs each test
with the Python loops and again with the compiled ones (``memory/pool_loops.py``); elsewhere a pool takes what
``pool_loops.loops()`` gives (compiled where the machine builds them)."""

from __future__ import annotations

import pytest

from minipaged_cli.memory import pool_loops
from tests.conftest import REQUIRE_SHARED, skip_unless_required

LOOP_KINDS = pytest.mark.parametrize("pool_loops_kind", ["python", "compiled"], indirect=True)


def compiled_loops() -> pool_loops.Loops:
    """The compiled loops; the test skips where this machine has no C compiler or no ``Python.h`` (fails in CI,
    and wherever a build ran and failed)."""
    compiled = pool_loops._compiled()
    if isinstance(compiled, RuntimeError):
        if "failed" in str(compiled):
            pytest.fail(str(compiled))
        skip_unless_required(str(compiled), REQUIRE_SHARED)
    assert isinstance(compiled, pool_loops.Loops)
    return compiled


@pytest.fixture(autouse=True)
def pool_loops_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    kind = getattr(request, "param", None)
    if kind is not None:
        chosen = pool_loops.PYTHON if kind == "python" else compiled_loops()
        monkeypatch.setattr(pool_loops, "loops", lambda: chosen)
    return kind
