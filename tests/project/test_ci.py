"""The CI contract: tests that need ../shared or nvcc fail in CI instead of skipping silently."""

from __future__ import annotations

import re

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


def test_no_test_reads_the_machines_clock() -> None:
    # A measured time depends on what else the machine runs: orderings, ratios and thresholds of real timings
    # belong in benchmarks/ (which print them), and tests time on a fake clock (test_step_time's _FakeDevice).
    clock = re.compile(r"\btime\.(perf_counter|process_time|time|monotonic|thread_time)\b|\bfrom time import\b"
                       r"|\btimeit\b|\bgetrusage\b")
    readers = {path.name: clock.findall(path.read_text()) for path in (ROOT / "tests").rglob("*.py")
               if path.name != "test_ci.py"}
    assert {name: found for name, found in readers.items() if found} == {}
