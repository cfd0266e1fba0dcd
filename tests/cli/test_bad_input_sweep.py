"""minipaged sweep: bad values in a --config file or on the command line, and unwritable outputs, are refused with
one line naming where (the file), the key or option and the value, exit 2, before any replay runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import minipaged_cli.cli.sweep as sweep_cli
from minipaged_cli.cli.main import app
from tests.conftest import ROOT

runner = CliRunner()
AZURE = str(ROOT / "traces" / "azure_conv_1k.yaml")
OPTIONS = ["--kv-memory", "4GiB", "--max-model-len", "8192", "--workers", "1"]  # none of the keys tested in a file
SMALL = ["--limit", "50", *OPTIONS]


@pytest.fixture
def no_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input must end the command before the sweep (hours on a real trace) starts."""

    def sweep(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sweep ran before the bad input was refused")

    monkeypatch.setattr(sweep_cli, "sweep", sweep)


def _refused(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["sweep", AZURE, *args])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(message), result.output


@pytest.mark.parametrize(("line", "message"), [
    ("search_steps: five", "search_steps: 'five': must be a whole number"),
    ("watermark: high", "watermark: 'high': must be a finite number"),
    ("watermark: 1", "watermark: 1: must be < 1"),
    ("limit: 3.5", "limit: 3.5: must be a whole number"),
    ("seed: -1", "seed: -1: must be >= 0"),
    ("seeds: 0", "seeds: 0: must be >= 1"),
    ("max_num_seqs: true", "max_num_seqs: True: must be a whole number"),
    ("max_batched_tokens: 0", "max_batched_tokens: 0: must be >= 1"),
    ("cpu_blocks: -2", "cpu_blocks: -2: must be >= 0"),
    ("time_scale: .inf", "time_scale: inf: must be a finite number"),
    ("gpu_memory_utilization: 1.5", "gpu_memory_utilization: 1.5: must be <= 1"),
    ("rates: [1, .nan]", "rates: nan: must be a finite number"),
    ("rates: [1, two]", "rates: 'two': must be a finite number"),
    ("block_sizes: [16.5]", "block_sizes: 16.5: must be a whole number"),
    ("prefix_caching: [maybe]", "prefix_caching: 'maybe': expected on or off"),
    ("strategies: [paged, buddy]", "strategies: 'buddy': unknown strategy"),
    ("strategies: [7]", "strategies: 7: unknown strategy"),
    ("models: [7]", "models: 7: must be text"),
    ("slo: {ttft: fast}", "slo.ttft: 'fast': must be a finite number"),
    ("slo: {ttft: -1}", "slo.ttft: -1: must be > 0"),
    ("slo: {latency: 1}", "slo.latency: 'latency': unknown SLO"),
    ("slo: 3", "slo: 3: expected a mapping of SLO names to seconds"),
    ("preemption: sometimes", "preemption: 'sometimes': expected one of recompute, swap"),
    ("trace_format: xml", "trace_format: 'xml': expected one of"),
    ("scheduler: v2", "scheduler: 'v2': expected one of v1, v0"),
    ("scheduler: 1", "scheduler: 1: expected one of v1, v0"),
])
def test_a_bad_config_value_names_the_file_the_key_and_the_value(tmp_path: Path, no_sweep: None, line: str,
                                                                  message: str) -> None:
    config = tmp_path / "sweep.yaml"
    key = line.partition(":")[0]  # (the line takes the place of a default it names: no key written twice)
    defaults = [default for default in ("rates: [1]", "strategies: [paged]") if not default.startswith(f"{key}:")]
    config.write_text("\n".join([*defaults, line]) + "\n")
    _refused([*OPTIONS, "--config", str(config)], f"error: {config}: {message}")


@pytest.mark.parametrize(("args", "message"), [
    (["--rates", "1", "--watermark", "nan"], "error: --watermark: nan: must be a finite number"),
    (["--rates", "1", "--time-scale", "inf"], "error: --time-scale: inf: must be a finite number"),
    (["--rates", "1,inf"], "error: --rates: inf: must be a finite number"),
    (["--rates", "1", "--seed", "-1"], "error: --seed: -1: must be >= 0"),
    (["--rates", "1", "--seeds", "0"], "error: --seeds: 0: must be >= 1"),
    (["--rates", "1", "--search-steps", "-1"], "error: --search-steps: -1: must be >= 0"),
    (["--rates", "1", "--workers", "0"], "error: --workers: 0: must be >= 1"),
    (["--rates", "1", "--block-sizes", "16,8.5"], "error: --block-sizes: 8.5: must be a whole number"),
    (["--rates", "1", "--slo", "ttft=inf"], "error: --slo: inf: must be a finite number"),
    (["--rates", "1", "--slo", "ttft=soon"], "error: --slo: 'soon': must be a finite number"),
    (["--rates", "1", "--scheduler", "v2"], "error: --scheduler: 'v2': expected one of v1, v0"),
])
def test_a_bad_option_value_is_one_line(no_sweep: None, args: list[str], message: str) -> None:
    _refused([*SMALL, "--strategies", "paged", *args], message)


def test_the_command_line_names_its_option_when_it_overrides_the_file(tmp_path: Path, no_sweep: None) -> None:
    config = tmp_path / "sweep.yaml"
    config.write_text("rates: [1]\nstrategies: [paged]\nsearch_steps: 3\n")
    _refused([*SMALL, "--config", str(config), "--search-steps", "-2"], "error: --search-steps: -2: must be >= 0")


@pytest.mark.parametrize(("option", "path", "message"), [
    ("--json", "no/such/dir/s.json", "no such directory"),
    ("--csv", ".", "is a directory"),
    ("--plot", "no/such/dir/s.png", "no such directory"),
])
def test_an_unwritable_output_is_refused_before_the_sweep(tmp_path: Path, no_sweep: None, option: str, path: str,
                                                          message: str) -> None:
    target = str(tmp_path / path)
    _refused([*SMALL, "--rates", "1", "--strategies", "paged", option, target],
             f"error: {option}: {target!r}: {message}")
