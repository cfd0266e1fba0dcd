"""benchmarks/gpu_session.sh --check: what the rare GPU window will run is checked here, on every commit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.native_build
@pytest.mark.slow
def test_the_gpu_script_selects_real_tests_runs_parsable_commands_and_fits_its_budget() -> None:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    env = {**os.environ, "PYTHON": sys.executable}  # this interpreter, with the project's dependencies
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), "--check"], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout
    assert "check passed" in output
    assert "bench: every case runs" in output  # the benchmark's code, on tiny shapes through the emulated kernels
    assert int(re.search(r"collects (\d+) tests", output).group(1)) > 0  # pytest -m gpu
    # memcheck's selection, then racecheck/synccheck/initcheck's: each test id collects exactly one test
    selected = re.findall(r"^\s+(\d+)\s+tests/dataplane/test_kernels.py::(\w+)\[(.*)\]$", output, re.M)
    assert {name for _, name, _ in selected} >= {
        "test_gpu_attention_on_vllm_shapes", "test_gpu_cache_write_is_bit_exact", "test_gpu_copy_blocks_is_exact",
        "test_gpu_tensor_core_kernel_on_small_batches"}
    assert all(count == "1" and "bfloat16" in ids for count, _, ids in selected)
    assert re.search(r"^racecheck synccheck initcheck: the selection collects [1-9]", output, re.M)
    total, budget = map(int, re.search(r"= (\d+) s of at most (\d+) s", output).groups())
    assert total <= budget <= 480
