from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from minipaged_cli.workloads.presets import GpuSpec, ModelSpec

# Hypothesis times every example on the machine's clock (its deadline, its too_slow health check): on a busy
# machine that fails property tests that are right. No property test here depends on it.
settings.register_profile("minipaged", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("minipaged")

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"


@pytest.fixture
def tiny_model() -> ModelSpec:
    """A model whose shapes do not matter: with ``clock_gpu`` every step lasts exactly 1 ms."""
    return ModelSpec(name="tiny", num_layers=1, hidden_size=8, intermediate_size=8, num_q_heads=1, num_kv_heads=1,
                     head_dim=8, vocab_size=8, tie_word_embeddings=True, gated_mlp=True, dtype="float16",
                     max_model_len=1024)


@pytest.fixture
def clock_gpu() -> GpuSpec:
    """Infinitely fast hardware: the roofline term vanishes and each step costs the 1 ms overhead."""
    return GpuSpec(name="clock", memory_bytes=1e12, hbm_bandwidth_bytes_per_s=1e30, peak_flops=1e30,
                   step_overhead_s=0.001)


REQUIRE_SHARED = "MINIPAGED_REQUIRE_SHARED"  # CI sets it: ../shared and nvcc are there, so a skip is a bug
REQUIRE_GPU = "MINIPAGED_REQUIRE_GPU"  # benchmarks/gpu_session.sh sets it: on the GPU machine a GPU test must run

# The reference venv of one vLLM release (parity/setup_env.sh, the same variables and paths): the parity tests run
# vLLM's own classes in it. MINIPAGED_VLLM_VERSION picks the release (0.34.0 by default, 0.33.0 also).
VLLM_VERSION = os.environ.get("MINIPAGED_VLLM_VERSION", "0.34.0")
VLLM_VENV = Path(os.environ.get("MINIPAGED_VLLM_VENV",
                                Path.home() / ".cache" / "minipaged" / f"vllm-{VLLM_VERSION}"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"


def needs_vllm_venv(test: Callable) -> Callable:
    """Mark a test that runs vLLM's code in the reference venv: ``needs_vllm`` and ``slow``, skipped without the
    venv."""
    skip = pytest.mark.skipif(not VLLM_PYTHON.exists(),
                              reason=f"no vLLM reference venv at {VLLM_VENV} (parity/setup_env.sh builds it)")
    return pytest.mark.slow(pytest.mark.needs_vllm(skip(test)))


def skip_unless_required(reason: str, switch: str) -> None:
    """Skip the test, or fail it where the environment variable ``switch`` is 1 (what the test needs must be
    there, so a silent skip would hide a broken set-up)."""
    if os.environ.get(switch) == "1":
        pytest.fail(f"{reason} ({switch}=1: this environment must have it)")
    pytest.skip(reason)


def shared_trace(name: str) -> Path:
    """A public trace from ../shared/traces; tests that need one skip where the checkout has none (fail in CI)."""
    path = SHARED_TRACES / name
    if not path.is_file():
        skip_unless_required(f"{path} is not available", REQUIRE_SHARED)
    return path
