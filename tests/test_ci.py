"""The CI contract: tests that need ../shared or nvcc fail in CI instead of skipping silently."""

from __future__ import annotations

import pytest

from tests.conftest import REQUIRE_SHARED, ROOT, skip_unless_required


def test_a_missing_requirement_skips_here_and_fails_where_it_is_required(monkeypatch) -> None:
    monkeypatch.delenv(REQUIRE_SHARED, raising=False)
    with pytest.raises(pytest.skip.Exception):
        skip_unless_required("nvcc is not installed", REQUIRE_SHARED)
    monkeypatch.setenv(REQUIRE_SHARED, "1")
    with pytest.raises(pytest.fail.Exception, match="nvcc is not installed"):
        skip_unless_required("nvcc is not installed", REQUIRE_SHARED)


def test_ci_requires_shared_and_runs_the_readme_test_command() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert f"export {REQUIRE_SHARED}=1" in script
    assert 'pip install -e ".[test]" && pytest -q' in script
    assert 'pip install -e ".[test]" && pytest -q' in (ROOT / "README.md").read_text()
