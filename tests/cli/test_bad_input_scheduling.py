"""Bad input around scheduling and the replay: one line and exit 2 on the command line, InputError in the library,
never a hang or a silent empty run."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import numpy as np
import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import replay
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, make_trace
from tests.conftest import ROOT

BURST = str(ROOT / "traces" / "burst.yaml")


def one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_run_says_every_request_was_rejected() -> None:
    # 3 blocks of 16 hold no request of burst.yaml: simulate refused that with one line; run printed "0 steps".
    line = one_line_error(["run", BURST, "--device", "cpu", "--num-blocks", "3"])
    assert "too small for any request under paged" in line


def test_swap_in_v1_is_one_line() -> None:
    line = one_line_error(["simulate", BURST, "--preemption", "swap", "--cpu-blocks", "100"])
    assert "--preemption: 'swap'" in line and "--scheduler v0" in line


@pytest.mark.parametrize(("args", "needle"), [
    (["--scheduler", "v2"], "--scheduler: 'v2': expected one of v1, v0"),
    (["--long-prefill-threshold", "-1"], "--long-prefill-threshold: -1: must be >= 0"),
    (["--max-num-seqs", "0"], "--max-num-seqs: 0: must be >= 1"),
])
def test_scheduling_options(args: list[str], needle: str) -> None:
    assert needle in one_line_error(["simulate", BURST, *args])


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail a test that hangs (on main a NaN step time never advanced the clock) instead of hanging the suite."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the replay hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("factor", [np.nan, np.inf, 0.0, -1.0])
@pytest.mark.parametrize("bulk", [True, False])
def test_replay_refuses_a_step_time_that_is_not_finite_and_positive(
        tiny_model: ModelSpec, clock_gpu: GpuSpec, monkeypatch: pytest.MonkeyPatch, alarm: None, factor: float,
        bulk: bool) -> None:
    model_seconds = StepTimeModel.step_seconds
    monkeypatch.setattr(StepTimeModel, "step_seconds", lambda self, **shape: model_seconds(self, **shape) * factor)
    trace = make_trace("t", [Request("a", 0.0, 10, 50), Request("b", 1.0, 10, 5)], source="test")
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=20, block_size=4, max_model_len=100)
    with pytest.raises(InputError, match=r"step time \(s\)"):
        replay(trace, config, "paged", bulk=bulk)
