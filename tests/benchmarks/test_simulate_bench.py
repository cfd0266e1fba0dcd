"""benchmarks/simulate_bench.py, which compares replay speed with an older checkout (replay speed within 10 % of
the replay before v1's scheduling): it runs and prints the ratio."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_simulate_bench_prints_the_ratio_to_a_baseline_checkout(tmp_path: Path) -> None:
    # Both sides are this checkout: the harness, not the speed, is under test here.
    rows = [f"2023-11-16 18:15:{second:02d}.0000000,{100 + 7 * second},{5 + second % 9}" for second in range(40)]
    (tmp_path / "AzureLLMInferenceTrace_conv.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                                              + "\n".join(rows) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "simulate_bench.py"), "--traces",
                             str(tmp_path), "--baseline-path", str(ROOT), "--ratio-requests", "40", "--repeats", "1"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("AzureLLMInferenceTrace_conv.csv")]
    assert [line.split()[1:3] for line in lines] == [["paged", "40"], ["paged", "+prefix"]]
    for line in lines:  # (the CPU seconds are printed rounded: too coarse here to recompute the ratio from)
        baseline_s, this_s, ratio = re.search(r"([\d.]+)\s+([\d.]+)\s+([\d.]+)x \((NOT )?within 1.10x\)$",
                                              line).groups()[:3]
        assert float(baseline_s) > 0 and float(this_s) > 0 and float(ratio) > 0
