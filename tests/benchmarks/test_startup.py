"""benchmarks/startup.py, which times simulate's start-up (and --version's, --help's) against the interpreter's, the
libraries' imports and a baseline checkout's: it runs and prints every figure and ratio."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import ROOT


def test_startup_bench_prints_the_figures_and_ratios() -> None:
    # The baseline is this checkout: the harness, not the speed, is under test here.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--runs", "1",
                             "--baseline-path", str(ROOT)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    seconds = dict(re.findall(r"^  (.+?) +(\d+\.\d{3})\b", result.stdout, re.MULTILINE))
    runs = {f"{name}, {checkout}" for name in ("simulate", "--version", "--help")
            for checkout in ("this checkout", "baseline")}
    assert set(seconds) == {"python -c pass", "python -c 'import numpy'", "the libraries' imports", *runs}
    assert all(float(value) > 0 for value in seconds.values())
    assert re.search(r"simulate / python -c pass: [\d.]+x · simulate / import numpy: [\d.]+x", result.stdout)
    for name in ("simulate", "--version", "--help"):
        assert re.search(rf"^{name}, baseline / this checkout: [\d.]+x", result.stdout, re.MULTILINE)
