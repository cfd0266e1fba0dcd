"""The vLLM parity harness (parity/): its records and comparison against hand-worked schedules, and minipaged against
the venv's vLLM release's own v1 scheduler (0.34.0 by default, 0.33.0 with MINIPAGED_VLLM_VERSION) on a few small
cases.

The replay against vLLM needs the reference venv (parity/setup_env.sh, about 2 GB): without it the test is skipped,
except in CI (MINIPAGED_REQUIRE_SHARED=1, and .ci/run builds the venv), where it must run.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request, Trace
from parity.steps import StepRecord, first_difference, first_difference_by_field, minipaged_steps
from tests.conftest import REQUIRE_SHARED, VLLM_VENV, skip_unless_required

ROOT = Path(__file__).resolve().parents[2]


def _config(**options: object) -> SimConfig:
    return SimConfig.of(model=load_model("qwen3-8b"), gpu=load_gpu("h200"), num_blocks=100, block_size=16,
                        watermark=0.0, **options)


def test_records_one_request_chunk_by_chunk() -> None:
    # Hand-worked: a 40-token prompt under a 16-token budget prefills 16, 16, 8 (the last chunk samples the first
    # output token), then decodes the other two output tokens one a step; it finishes in the fifth step.
    trace = Trace("one", (Request("a", 0.0, prompt_tokens=40, output_tokens=3),))
    record = minipaged_steps(trace, _config(max_batched_tokens=16))
    assert [s.scheduled for s in record.steps] == [{"0": 16}, {"0": 16}, {"0": 8}, {"0": 1}, {"0": 1}]
    assert [s.finished for s in record.steps] == [[], [], [], [], ["0"]]
    assert record.num_preemptions == 0
    assert all(s.duration_s > 0 for s in record.steps)
    assert record.makespan_s == pytest.approx(sum(s.duration_s for s in record.steps))


def test_records_a_preemption_and_the_recompute() -> None:
    # Hand-worked, 2 blocks of 16 tokens: a (16-token prompt, 4 out) and b (15, 4 out) prefill together in one
    # block each. Step 1: a's decode writes its token 17 and needs a second block: b, the last running, is
    # preempted (nothing is admitted in that step). Steps 2-3: a decodes and finishes (it samples one token in
    # its prefill and three decoding). Step 4: b recomputes its prompt and its one generated token (16), then
    # decodes twice, the first into a new block.
    trace = Trace("two", (Request("a", 0.0, 16, 4), Request("b", 0.0, 15, 4)))
    config = SimConfig.of(model=load_model("qwen3-8b"), gpu=load_gpu("h200"), num_blocks=2, block_size=16,
                          watermark=0.0, max_batched_tokens=64, max_model_len=32)
    record = minipaged_steps(trace, config)
    assert [s.scheduled for s in record.steps] == [{"0": 16, "1": 15}, {"0": 1}, {"0": 1}, {"0": 1}, {"1": 16},
                                                   {"1": 1}, {"1": 1}]
    assert [s.preempted for s in record.steps] == [[], ["1"], [], [], [], [], []]
    assert [s.finished for s in record.steps] == [[], [], [], ["0"], [], [], ["1"]]
    assert [s.used_blocks for s in record.steps] == [2, 2, 2, 2, 1, 2, 2]


def _step(scheduled: dict[str, int], used_blocks: int = 0, preempted: tuple[str, ...] = ()) -> StepRecord:
    return StepRecord(0.0, scheduled, list(preempted), used_blocks=used_blocks)


def test_first_difference() -> None:
    same = [_step({"0": 16}), _step({"0": 1, "1": 15})]
    assert first_difference(same, [_step({"0": 16}), _step({"1": 15, "0": 1})]) is None  # order is no decision
    assert first_difference(same, [_step({"0": 16}), _step({"0": 1, "1": 14})]) == 1
    assert first_difference(same, same[:1]) == 1  # one replay has a step the other lacks
    assert first_difference([_step({}, preempted=("1", "2"))], [_step({}, preempted=("2", "1"))]) is None
    by_field = first_difference_by_field([_step({"0": 16}, 1), _step({"0": 8}, 2)],
                                         [_step({"0": 16}, 3), _step({"0": 9}, 2)])
    assert by_field == {"used_blocks": 0, "scheduled": 1}


def _harness(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINIPAGED_VLLM_VENV=str(VLLM_VENV))
    return subprocess.run(["bash", str(ROOT / "parity/run.sh"), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


def test_bad_input_is_one_line_and_exit_2() -> None:
    # Runs with this interpreter: bad input fails before vLLM is imported, so no venv is needed.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "parity.vllm_parity", "traces/mixed.yaml", "--num-blocks", "100"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "--max-model-len" in result.stderr and "vLLM will not start" in \
        result.stderr
    missing = subprocess.run([sys.executable, "-m", "parity.vllm_parity", "--table", "nowhere.yaml"],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert missing.returncode == 2 and "nowhere.yaml" in missing.stderr


@pytest.mark.needs_vllm
@pytest.mark.slow
def test_identical_to_vllm_v1() -> None:
    if not (VLLM_VENV / ".minipaged-parity-complete").is_file():
        skip_unless_required(f"no vLLM reference venv at {VLLM_VENV}: build it with parity/setup_env.sh (about 2 GB)",
                             REQUIRE_SHARED)  # .ci/run builds it
    result = _harness("--table", "parity/ci_cases.yaml")
    assert result.returncode in (0, 1), result.stderr  # 2: bad input, else an internal error
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "blocks" in line]
    assert len(rows) == 4, result.stdout
    assert result.returncode == 0, f"minipaged's v1 scheduling parts from vLLM's:\n{result.stdout}"


@pytest.mark.needs_vllm
@pytest.mark.slow
def test_cache_aware_admission_identical_to_vllm_034() -> None:
    # vLLM 0.34.0's cache-aware admission on cases built to trigger it (parity/cache_aware_cases.yaml); 0.33.0 has
    # no such option, so its venv runs none of them.
    if not (VLLM_VENV / ".minipaged-parity-complete").is_file():
        skip_unless_required(f"no vLLM reference venv at {VLLM_VENV}: build it with parity/setup_env.sh (about 2 GB)",
                             REQUIRE_SHARED)
    if not list(VLLM_VENV.glob("lib/python*/site-packages/vllm-0.34.*.dist-info")):
        pytest.skip(f"the venv at {VLLM_VENV} is not vLLM 0.34: cache-aware admission is 0.34.0's")
    result = _harness("--table", "parity/cache_aware_cases.yaml")
    assert result.returncode in (0, 1), result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "cache-aware" in line]
    assert len(rows) == 4, result.stdout
    assert result.returncode == 0, f"minipaged's cache-aware admission parts from vLLM's:\n{result.stdout}"


def test_the_package_never_imports_vllm_or_the_harness() -> None:
    # vLLM lives in its own venv: the package must install and run without it, and never reach into parity/.
    offenders = []
    for path in (ROOT / "minipaged_cli").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(ROOT)}: {name}" for name in names
                          if name.split(".")[0] in ("vllm", "parity")]
    assert offenders == []
